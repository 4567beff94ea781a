//! Reading the model's files for `--model-dir` (contract 5: the webhook mounts the vLLM container's model volume
//! read-only into the sidecar and passes its path): `config.json` for the geometry, and the safetensors index or
//! headers for the weight bytes. Every read is bounded, so a wrong path or a hostile file cannot make the sidecar
//! read gigabytes; the parsing itself is `tessera_core::recommend::geometry`'s.
//!
//! Only headers are read from weight files: the 8-byte length and the JSON after it, never the tensors.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use tessera_core::recommend::geometry::{
    GeometryError, ModelGeometry, TensorBytes, safetensors_header_bytes, safetensors_index_bytes,
};
use tessera_core::recommend::{Dtype, ModelFacts};

/// Largest `config.json` read (real ones are a few KiB; multimodal ones with label maps tens of KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Largest `model.safetensors.index.json` read (a 400B-parameter model's index is a few MiB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// Largest safetensors header read: the format's own limit (100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Most `*.safetensors` files whose headers are read.
pub const MAX_SHARDS: usize = 4096;

/// A model directory that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelDirError {
    /// No `config.json` where `--model-dir` points.
    #[error(
        "{0} holds no config.json: point --model-dir at the directory with the model's config.json (in a Hugging \
         Face cache, models--ORG--NAME/snapshots/REVISION)"
    )]
    NoConfig(PathBuf),
    /// A read failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file is larger than it may be.
    #[error("{path} is {size} bytes, more than the {limit} a {what} may have")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (or the size its header claims).
        size: u64,
        /// The bound.
        limit: u64,
        /// What it is.
        what: &'static str,
    },
    /// A file does not parse.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: GeometryError,
    },
    /// More weight files than are read.
    #[error("{dir} holds more than {MAX_SHARDS} safetensors files")]
    TooManyShards {
        /// The directory.
        dir: PathBuf,
    },
}

/// What the model's files say.
#[derive(Debug)]
pub struct ModelFiles {
    /// From `config.json`.
    pub geometry: ModelGeometry,
    /// Weight bytes on disk (`None` when the model has no safetensors files, e.g. `.bin` checkpoints), or why
    /// they could not be read; the geometry is still used then.
    pub weights: Result<Option<TensorBytes>, ModelDirError>,
    /// What makes sleep mode risky for this model (a hybrid or sliding-window one, `core::sleep::risk`).
    pub sleep_risk: Option<String>,
}

impl ModelFiles {
    /// The facts the recommendation takes, for a server run with `run_dtype` (`--dtype`, `None` = auto) over
    /// `tensor_parallel_size` GPUs: weights are split evenly across them.
    pub fn facts(&self, run_dtype: Option<Dtype>, tensor_parallel_size: u32) -> ModelFacts {
        let tp = tensor_parallel_size.max(1);
        ModelFacts {
            geometry: self.geometry,
            weights_bytes: self
                .weights
                .as_ref()
                .ok()
                .copied()
                .flatten()
                .map(|w| w.loaded(run_dtype) / u64::from(tp)),
            run_dtype,
            tensor_parallel_size: tp,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ModelDirError + '_ {
    move |source| ModelDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a whole small file, refusing one larger than `limit`.
fn read_bounded(path: &Path, limit: u64, what: &'static str) -> Result<String, ModelDirError> {
    let file = File::open(path).map_err(io_err(path))?;
    let size = file.metadata().map_err(io_err(path))?.len();
    if size > limit {
        return Err(ModelDirError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit,
            what,
        });
    }
    let mut text = String::new();
    // `take` bounds the read even if the file grows after the size was checked.
    file.take(limit).read_to_string(&mut text).map_err(io_err(path))?;
    Ok(text)
}

/// Reads a safetensors file's header (never its tensors).
fn read_header(path: &Path) -> Result<TensorBytes, ModelDirError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io_err(path))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(ModelDirError::TooLarge {
            path: path.to_path_buf(),
            size: n,
            limit: MAX_HEADER_BYTES,
            what: "safetensors header",
        });
    }
    let mut header = String::new();
    let read = file.take(n).read_to_string(&mut header).map_err(io_err(path))?;
    if read as u64 != n {
        return Err(ModelDirError::Io {
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the header claims {n} bytes, the file has {read}"),
            ),
        });
    }
    safetensors_header_bytes(&header).map_err(|source| ModelDirError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

fn read_weights(dir: &Path, geometry: &ModelGeometry) -> Result<Option<TensorBytes>, ModelDirError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = read_bounded(&index, MAX_INDEX_BYTES, "safetensors index")?;
        let total = safetensors_index_bytes(&text).map_err(|source| ModelDirError::Parse {
            path: index.clone(),
            source,
        })?;
        // The index names no dtypes: a float32 checkpoint (by its config) is all float32.
        let float32 = if geometry.dtype == Some(Dtype::Float32) {
            total
        } else {
            0
        };
        return Ok(Some(TensorBytes { total, float32 }));
    }
    let mut shards: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            if shards.len() == MAX_SHARDS {
                return Err(ModelDirError::TooManyShards {
                    dir: dir.to_path_buf(),
                });
            }
            shards.push(path);
        }
    }
    if shards.is_empty() {
        return Ok(None);
    }
    shards.sort();
    let mut total = TensorBytes::default();
    for s in &shards {
        total = total.plus(read_header(s)?);
    }
    Ok(Some(total))
}

/// Reads `dir`'s `config.json` (required) and its weights' sizes (best effort).
pub fn read_model_dir(dir: &Path) -> Result<ModelFiles, ModelDirError> {
    let config = dir.join("config.json");
    if !config.is_file() {
        return Err(ModelDirError::NoConfig(dir.to_path_buf()));
    }
    let text = read_bounded(&config, MAX_CONFIG_BYTES, "config.json")?;
    let geometry = ModelGeometry::from_config_json(&text).map_err(|source| ModelDirError::Parse {
        path: config.clone(),
        source,
    })?;
    let weights = read_weights(dir, &geometry);
    let sleep_risk = serde_json::from_str(&text)
        .ok()
        .and_then(|v| tessera_core::sleep::risk::from_model_config(&v));
    Ok(ModelFiles {
        geometry,
        weights,
        sleep_risk,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    fn models() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models")
    }

    /// Writes a safetensors file with the given header and `data` bytes of tensors.
    fn safetensors(path: &Path, header: &str, data: usize) {
        let mut f = File::create(path).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        f.write_all(&vec![0u8; data]).unwrap();
    }

    #[test]
    fn reads_real_configs_and_safetensors_headers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            models().join("tiny-llama-cpu/config.json"),
            dir.path().join("config.json"),
        )
        .unwrap();
        // No weights at all (vLLM's --load-format dummy): geometry only.
        let m = read_model_dir(dir.path()).unwrap();
        assert_eq!(m.geometry.layers, 2);
        assert!(matches!(m.weights, Ok(None)));
        // Two shards: the sum of their tensors' byte ranges; float32 tensors halve under vLLM's auto dtype.
        safetensors(
            &dir.path().join("model-00001-of-00002.safetensors"),
            r#"{"a":{"dtype":"BF16","shape":[1024],"data_offsets":[0,2048]}}"#,
            2048,
        );
        safetensors(
            &dir.path().join("model-00002-of-00002.safetensors"),
            r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[256],"data_offsets":[0,1024]}}"#,
            1024,
        );
        let m = read_model_dir(dir.path()).unwrap();
        let w = m.weights.as_ref().unwrap().unwrap();
        assert_eq!((w.total, w.float32), (3072, 1024));
        let f = m.facts(None, 1);
        assert_eq!(f.weights_bytes, Some(2560));
        assert_eq!(m.facts(None, 2).weights_bytes, Some(1280));
        assert_eq!(m.facts(Some(Dtype::Float32), 1).weights_bytes, Some(3072));
        assert_eq!(f.kv_bytes_per_token(None).unwrap().bytes_per_token, 512);
        // The index wins when there is one.
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata":{"total_size":16000000000},"weight_map":{}}"#,
        )
        .unwrap();
        let m = read_model_dir(dir.path()).unwrap();
        assert_eq!(m.facts(None, 1).weights_bytes, Some(16_000_000_000));
    }

    #[test]
    fn errors_are_clear_and_reads_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_model_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("no config.json"), "{e}");
        std::fs::write(dir.path().join("config.json"), "{\"num_attention_heads\": 4}").unwrap();
        let e = read_model_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
        // A config larger than the bound is refused without being read.
        let big = vec![b' '; (MAX_CONFIG_BYTES + 1) as usize];
        std::fs::write(dir.path().join("config.json"), big).unwrap();
        let e = read_model_dir(dir.path()).unwrap_err();
        assert!(
            matches!(
                e,
                ModelDirError::TooLarge {
                    what: "config.json",
                    ..
                }
            ),
            "{e}"
        );
        // A header that claims more than safetensors allows, or more than the file holds: weights unknown,
        // geometry still read.
        std::fs::copy(
            models().join("qwen2-7b/config.json"),
            dir.path().join("config.json"),
        )
        .unwrap();
        let mut f = File::create(dir.path().join("model.safetensors")).unwrap();
        f.write_all(&u64::MAX.to_le_bytes()).unwrap();
        drop(f);
        let m = read_model_dir(dir.path()).unwrap();
        assert!(matches!(
            m.weights,
            Err(ModelDirError::TooLarge {
                what: "safetensors header",
                ..
            })
        ));
        assert_eq!(m.facts(None, 1).weights_bytes, None);
        assert_eq!(
            m.facts(None, 1).kv_bytes_per_token(None).unwrap().bytes_per_token,
            57_344
        );
        let mut f = File::create(dir.path().join("model.safetensors")).unwrap();
        f.write_all(&100u64.to_le_bytes()).unwrap();
        f.write_all(b"{}").unwrap();
        drop(f);
        let e = read_model_dir(dir.path()).unwrap().weights.unwrap_err();
        assert!(e.to_string().contains("claims 100 bytes"), "{e}");
    }
}
