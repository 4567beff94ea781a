//! Reading a GPU-sharing pod list in the Alibaba `openb` format.
//!
//! Header: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
//! scheduled_time` (extra columns are ignored, order is free). An optional `gpu_memory_mib` column adds the
//! GPU-memory dimension; without it the packing is compute-only, which is all the published trace records.
//! A pod is *fractional* when `num_gpu == 1 && gpu_milli < 1000`; others (CPU-only or whole GPUs) are counted
//! and skipped. Times are seconds from the trace start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One fractional pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// The `name` column.
    pub name: String,
    /// `gpu_milli`, 1..=999.
    pub gpu_milli: u32,
    /// `gpu_memory_mib`, when the column exists.
    pub gpu_memory_mib: Option<u64>,
    /// `creation_time`, seconds.
    pub creation: u64,
    /// `deletion_time`, seconds; `None` when empty (still running when the trace ends).
    pub deletion: Option<u64>,
    /// The 1-based line in the file, for messages.
    pub line: u64,
}

impl Pod {
    /// The pod as a packing request. Each trace pod is its own workload: the name doubles as the model, so
    /// spreading never applies.
    pub fn request(&self) -> tessera_core::pack::ReplicaRequest {
        tessera_core::pack::ReplicaRequest::new(
            self.name.clone(),
            self.name.clone(),
            self.gpu_milli,
            self.gpu_memory_mib.unwrap_or(0),
        )
    }
}

/// What was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodList {
    /// The fractional pods, in file order.
    pub pods: Vec<Pod>,
    /// Data rows read.
    pub rows: usize,
    /// Rows skipped because they ask for no GPU.
    pub cpu_only: usize,
    /// Rows skipped because they ask for one or more whole GPUs.
    pub whole_gpu: usize,
    /// Whether the file has a `gpu_memory_mib` column.
    pub has_memory: bool,
}

/// Why a pod list could not be read. Every variant names the file, and the line where there is one.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CSV itself is malformed (unbalanced quotes, a row with a different number of fields, bad UTF-8).
    #[error("{path}:{line}: malformed CSV: {message}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The CSV reader's message.
        message: String,
    },
    /// A required column is absent from the header.
    #[error(
        "{path}: the header has no {column:?} column; expected the openb pod list header \
         name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time \
         (plus an optional gpu_memory_mib)"
    )]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column.
        column: &'static str,
    },
    /// A field has a value that cannot be used.
    #[error("{path}:{line}: {column} = {value:?}: {why}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The column.
        column: &'static str,
        /// The value found.
        value: String,
        /// What is wrong and what is expected.
        why: String,
    },
    /// Two rows have the same pod name (assignments are written by name, so names must be unique).
    #[error("{path}:{line}: pod name {name:?} already appears on line {first}; pod names must be unique")]
    DuplicateName {
        /// The file.
        path: PathBuf,
        /// The second line.
        line: u64,
        /// The first line.
        first: u64,
        /// The name.
        name: String,
    },
}

/// Reads a pod list from a file.
pub fn read_pod_list(path: &Path) -> Result<PodList, InputError> {
    let file = std::fs::File::open(path).map_err(|source| InputError::Io {
        path: path.into(),
        source,
    })?;
    parse_pod_list(std::io::BufReader::new(file), path)
}

/// Parses a pod list from any reader; `path` only labels messages.
pub fn parse_pod_list(reader: impl std::io::Read, path: &Path) -> Result<PodList, InputError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(reader);
    let csv_err = |e: csv::Error| InputError::Csv {
        path: path.into(),
        line: e.position().map_or(1, |p| p.line()),
        message: e.to_string(),
    };
    let headers = rdr.headers().map_err(csv_err)?.clone();
    let col = |name: &'static str| headers.iter().position(|h| h == name);
    let need = |name: &'static str| {
        col(name).ok_or(InputError::MissingColumn {
            path: path.into(),
            column: name,
        })
    };
    let c_name = need("name")?;
    let c_num = need("num_gpu")?;
    let c_milli = need("gpu_milli")?;
    let c_create = need("creation_time")?;
    let c_delete = need("deletion_time")?;
    let c_mem = col("gpu_memory_mib");

    let mut out = PodList {
        pods: Vec::new(),
        rows: 0,
        cpu_only: 0,
        whole_gpu: 0,
        has_memory: c_mem.is_some(),
    };
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_err(e)),
        }
        out.rows += 1;
        let line = record.position().map_or(0, |p| p.line());
        let field = |i: usize| record.get(i).unwrap_or("");
        let bad = |column: &'static str, value: &str, why: &str| InputError::BadValue {
            path: path.into(),
            line,
            column,
            value: value.to_string(),
            why: why.to_string(),
        };
        let name = field(c_name);
        if name.is_empty() {
            return Err(bad("name", name, "every pod needs a name"));
        }
        let num_gpu: u32 = field(c_num).parse().map_err(|_| {
            bad(
                "num_gpu",
                field(c_num),
                "expected a whole number of GPUs (0, 1, 2, …)",
            )
        })?;
        let gpu_milli: u32 = field(c_milli).parse().map_err(|_| {
            bad(
                "gpu_milli",
                field(c_milli),
                "expected an integer number of milli-GPUs, 0..=1000",
            )
        })?;
        if gpu_milli > 1000 {
            return Err(bad(
                "gpu_milli",
                field(c_milli),
                "a GPU has 1000 milli-GPUs; use num_gpu for more",
            ));
        }
        if let Some(&first) = seen.get(name) {
            return Err(InputError::DuplicateName {
                path: path.into(),
                line,
                first,
                name: name.to_string(),
            });
        }
        seen.insert(name.to_string(), line);
        if num_gpu == 0 {
            out.cpu_only += 1;
            continue;
        }
        if num_gpu > 1 || gpu_milli == 1000 {
            out.whole_gpu += 1;
            continue;
        }
        if gpu_milli == 0 {
            return Err(bad(
                "gpu_milli",
                field(c_milli),
                "num_gpu is 1 but gpu_milli is 0; a GPU pod needs 1..=1000",
            ));
        }
        let creation: u64 = field(c_create).parse().map_err(|_| {
            bad(
                "creation_time",
                field(c_create),
                "expected whole seconds from the trace start",
            )
        })?;
        let deletion = match field(c_delete) {
            "" => None,
            v => {
                let d: u64 = v.parse().map_err(|_| {
                    bad(
                        "deletion_time",
                        v,
                        "expected whole seconds from the trace start, or empty if still running",
                    )
                })?;
                if d < creation {
                    return Err(bad(
                        "deletion_time",
                        v,
                        &format!("is before creation_time {creation}; a pod cannot end before it starts"),
                    ));
                }
                Some(d)
            }
        };
        let gpu_memory_mib = match c_mem {
            None => None,
            Some(i) => Some(field(i).parse().map_err(|_| {
                bad(
                    "gpu_memory_mib",
                    field(i),
                    "expected whole MiB; an unknown value cannot be packed safely (fill it in or drop the column)",
                )
            })?),
        };
        out.pods.push(Pod {
            name: name.to_string(),
            gpu_milli,
            gpu_memory_mib,
            creation,
            deletion,
            line,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    fn parse(body: &str) -> Result<PodList, InputError> {
        parse_pod_list(format!("{HEADER}{body}").as_bytes(), Path::new("pods.csv"))
    }

    #[test]
    fn keeps_fractional_pods_and_counts_the_rest() {
        let l = parse(
            "a,1000,100,1,500,,LS,Running,0,10,0\n\
             b,1000,100,0,0,,LS,Running,0,10,0\n\
             c,1000,100,1,1000,,LS,Running,0,10,0\n\
             d,1000,100,2,1000,,LS,Running,0,10,0\n\
             e,1000,100,1,250,,BE,Pending,5,,\n",
        )
        .unwrap();
        assert_eq!((l.rows, l.cpu_only, l.whole_gpu, l.pods.len()), (5, 1, 2, 2));
        assert_eq!(
            l.pods[1],
            Pod {
                name: "e".into(),
                gpu_milli: 250,
                gpu_memory_mib: None,
                creation: 5,
                deletion: None,
                line: 6
            }
        );
        assert!(!l.has_memory);
    }

    #[test]
    fn bad_rows_name_line_column_and_fix() {
        let e = parse("a,1,1,1,500,,LS,Running,0,10,0\nb,1,1,1,abc,,LS,Running,0,10,0\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "pods.csv:3: gpu_milli = \"abc\": expected an integer number of milli-GPUs, 0..=1000"
        );
        let e = parse("a,1,1,1,500,,LS,Running,20,10,0\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("pods.csv:2: deletion_time = \"10\": is before creation_time 20"),
            "{e}"
        );
        let e = parse("a,1,1,1,1500,,LS,Running,0,10,0\n").unwrap_err();
        assert!(e.to_string().contains("use num_gpu for more"), "{e}");
        let e = parse("a,1,1,1,500,,LS,Running,0,10,0\na,1,1,1,500,,LS,Running,0,10,0\n").unwrap_err();
        assert!(e.to_string().contains("already appears on line 2"), "{e}");
        let e = parse("a,1,1,1,500,,LS,Running,0,10\n").unwrap_err();
        assert!(e.to_string().starts_with("pods.csv:2: malformed CSV"), "{e}");
        let e = parse_pod_list("name,num_gpu\n".as_bytes(), Path::new("x.csv")).unwrap_err();
        assert!(e.to_string().contains("no \"gpu_milli\" column"), "{e}");
    }

    #[test]
    fn memory_column_is_read_and_must_be_filled() {
        let h = "name,num_gpu,gpu_milli,creation_time,deletion_time,gpu_memory_mib\n";
        let l = parse_pod_list(format!("{h}a,1,300,0,5,12000\n").as_bytes(), Path::new("m.csv")).unwrap();
        assert!(l.has_memory);
        assert_eq!(l.pods[0].gpu_memory_mib, Some(12000));
        let e = parse_pod_list(format!("{h}a,1,300,0,5,\n").as_bytes(), Path::new("m.csv")).unwrap_err();
        assert!(e.to_string().contains("m.csv:2: gpu_memory_mib"), "{e}");
    }
}
