//! Where batch files, batch records, result files and the runner's lease live: one interface, [`BatchStore`], so
//! a local volume (the default, a PVC in a cluster) and an object store can stand behind the same API and runner.
//!
//! What the runner needs of a store, and why:
//! - file data written as a stream ([`BatchStore::create_data`]) and read as a stream ([`BatchStore::open_data`]):
//!   a 200 MB upload is never held in memory;
//! - append to a result file ([`BatchStore::append_data`]) and cut a torn last line ([`BatchStore::truncate_data`]):
//!   results are kept as they complete, and a crash mid-write leaves at most one partial line to drop;
//! - fence a result file ([`BatchStore::fence_data`]) when a runner takes a batch over: a runner that was paused
//!   (not killed) past its lease may still have appends queued, and they must land where the taker never reads;
//! - a small document per batch and per file, replaced whole (written to a temporary name and renamed, so a reader
//!   never sees half of one);
//! - a cancel marker the API writes and the runner reads, so the runner stays the batch record's only writer;
//! - the runner's lease document, and an exclusive claim of each of its versions (so two runners never both hold
//!   it).
//!
//! An S3-compatible store fits the same calls except append: it would write each flush of results as its own
//! object under the result file's prefix and read them back in order, and fence by naming each lease version's
//! objects apart and reading back only the versions the taker adopted. Not implemented yet.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::objects::{BatchObject, FileObject};

/// A store's errors.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum StoreError {
    /// An I/O error on the store.
    #[error("batch store {path}: {source}")]
    Io {
        /// What was being read or written.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A stored document is not what this version writes.
    #[error("batch store {path}: unreadable document: {source}")]
    Corrupt {
        /// The document.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// An id with characters a store path cannot hold.
    #[error("invalid id {0:?}: ids are letters, digits, '-' and '_'")]
    BadId(String),
}

impl StoreError {
    /// A fixed label per variant, for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }

    /// Whether the thing asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The runner's lease as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseDoc {
    /// Who runs the batches.
    pub holder: String,
    /// Bumped on every write: a reader that sees the same version for a lease duration knows the holder is gone.
    pub version: u64,
    /// How long a holder that stops renewing keeps it, milliseconds.
    pub duration_ms: u64,
}

/// A stream of bytes being written to a store.
pub type DataWriter = Box<dyn AsyncWrite + Send + Unpin>;
/// A stream of bytes being read from a store.
pub type DataReader = Box<dyn AsyncRead + Send + Unpin>;

/// The batch store (see the module docs). Every id is checked with [`check_id`] first.
pub trait BatchStore: Send + Sync + std::fmt::Debug {
    /// Starts writing the data of `id` (replacing any).
    fn create_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataWriter, StoreError>>;
    /// Opens the data of `id` for appending (created when missing).
    fn append_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataWriter, StoreError>>;
    /// Reads the data of `id`.
    fn open_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataReader, StoreError>>;
    /// The data's length (0 when missing).
    fn data_len<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// Cuts the data of `id` to `len` bytes.
    fn truncate_data<'a>(&'a self, id: &'a str, len: u64) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Replaces file data `id` by a copy of itself, so that no writer opened before this call reaches what is
    /// read or appended after it. A writer's appends are queued before they reach the store (write-behind), so a
    /// runner paused past its lease can land answers after a taker has read the file: the taker fences each
    /// result file before reading it, and such late appends go to the old copy. A late append that reached the
    /// store before the fence is in the copy, where the taker's recovery counts it as answered. Missing data is
    /// left missing.
    fn fence_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Removes a file: its document, its data and its entry in its namespace's listing.
    fn delete_file<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Writes a file's document, and lists it under its namespace.
    fn put_file<'a>(&'a self, file: &'a FileObject) -> BoxFuture<'a, Result<(), StoreError>>;
    /// A file's document.
    fn get_file<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<FileObject>, StoreError>>;
    /// The files of `namespace`, newest first, without reading their documents (so a listing costs what its
    /// page holds, and nothing for another namespace's files).
    fn list_files<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<Listed>, StoreError>>;
    /// Writes a batch's document; lists it under its namespace, and among the active batches until it is final.
    fn put_batch<'a>(&'a self, batch: &'a BatchObject) -> BoxFuture<'a, Result<(), StoreError>>;
    /// A batch's document.
    fn get_batch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<BatchObject>, StoreError>>;
    /// The batches of `namespace`, newest first, without reading their documents.
    fn list_batches<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<Listed>, StoreError>>;
    /// The ids of every batch not final yet (what the runner looks at), without reading the others.
    fn active_batches(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;
    /// Records that a client asked to cancel batch `id`.
    fn request_cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Whether a cancel of batch `id` was asked for.
    fn cancel_requested<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// The runner's lease, if any.
    fn get_lease(&self) -> BoxFuture<'_, Result<Option<LeaseDoc>, StoreError>>;
    /// Writes the runner's lease.
    fn put_lease<'a>(&'a self, lease: &'a LeaseDoc) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Claims lease `version` for `holder`, exclusively: of any number of writers claiming one version, exactly one
    /// gets `true`. Every lease write (take, renew) claims its version first, so two runners can never both
    /// believe they hold the lease: a taker and a stalled holder that wakes up race for the same version.
    fn claim_lease_version<'a>(
        &'a self,
        version: u64,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// The highest lease version claimed so far and who claimed it (`None` when nothing was). A holder killed
    /// between its claim and its lease write leaves a claim newer than the lease: a taker must judge that claim,
    /// not the lease document, or it would claim the dead holder's version forever.
    fn latest_lease_claim(&self) -> BoxFuture<'_, Result<Option<LeaseClaim>, StoreError>>;
}

/// One entry of a namespace's listing: the id, and for a file its size (what the namespace's byte quota counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The file or batch id.
    pub id: String,
    /// The file's bytes (0 for a batch).
    pub bytes: u64,
}

/// Sorts a listing newest first. Ids begin with their creation time in nanoseconds as 16 hex digits (see
/// `Batches::new_id`), so the order of ids is the order of creation, read without opening a document.
pub fn newest_first(items: &mut [Listed]) {
    items.sort_by(|a, b| b.id.cmp(&a.id));
}

/// A claimed lease version, as [`BatchStore::latest_lease_claim`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    /// The version claimed.
    pub version: u64,
    /// Who claimed it (empty when the claimer died before writing its name).
    pub holder: String,
}

/// Refuses an id that could name a path outside the store (ids are ours, `file-…` and `batch_…`, but they come
/// back in URLs).
pub fn check_id(id: &str) -> Result<(), StoreError> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(StoreError::BadId(id.to_owned()));
    }
    Ok(())
}

/// A store in a local directory: `files/<id>.json` and `files/<id>.data`, `batches/<id>.json`,
/// `batches/<id>.cancel`, `lease.json`; and the listings, empty-bodied entries whose names are ids:
/// `index/<namespace>/files/<id>` (holding the file's size), `index/<namespace>/batches/<id>`, `active/<id>` (a
/// batch not final yet). A listing reads a directory of names, never the documents beside it.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The listings' layout version: a store written before the listings existed gets them built once at open.
const INDEX_BUILT: &str = "index/.built-v1";

/// The index folder of a namespace. A document written before namespaces were recorded has none: `_`, which no
/// Kubernetes namespace can be named.
fn ns_dir(namespace: &str) -> Result<&str, StoreError> {
    if namespace.is_empty() {
        return Ok("_");
    }
    check_id(namespace)?;
    Ok(namespace)
}

impl LocalStore {
    /// The store under `root`, its folders created when missing, and its listings built if it predates them.
    pub fn open(root: &Path) -> Result<LocalStore, StoreError> {
        for sub in ["files", "batches", "index", "active"] {
            let p = root.join(sub);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        let store = LocalStore {
            root: root.to_owned(),
        };
        if !root.join(INDEX_BUILT).exists() {
            store.build_index()?;
        }
        Ok(store)
    }

    /// Lists every document already in the store under its namespace (and the unfinished batches as active),
    /// reading one document at a time: a store of old, large documents is indexed in bounded memory.
    fn build_index(&self) -> Result<(), StoreError> {
        let read = |p: &Path| -> Result<Option<Vec<u8>>, StoreError> {
            match std::fs::read(p) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io(p)(e)),
            }
        };
        for (dir, is_file) in [("files", true), ("batches", false)] {
            let path = self.root.join(dir);
            for entry in std::fs::read_dir(&path).map_err(io(&path))? {
                let p = entry.map_err(io(&path))?.path();
                if p.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                let Some(bytes) = read(&p)? else { continue };
                let corrupt = |source| StoreError::Corrupt {
                    path: p.display().to_string(),
                    source,
                };
                if is_file {
                    let f: FileObject = serde_json::from_slice(&bytes).map_err(corrupt)?;
                    let entry = self.entry_path(&f.namespace, "files", &f.id)?;
                    write_entry(&entry, f.bytes.to_string().as_bytes())?;
                } else {
                    let b: BatchObject = serde_json::from_slice(&bytes).map_err(corrupt)?;
                    write_entry(&self.entry_path(&b.namespace, "batches", &b.id)?, b"")?;
                    if !b.status.is_final() {
                        write_entry(&self.active_path(&b.id)?, b"")?;
                    }
                }
            }
        }
        write_entry(&self.root.join(INDEX_BUILT), b"")
    }

    fn data_path(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.root.join("files").join(format!("{id}.data")))
    }

    /// Where [`BatchStore::fence_data`] builds its copy before renaming it into place (a crash leaves it behind;
    /// the next fence or the file's deletion removes it).
    fn fence_path(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.root.join("files").join(format!("{id}.fence")))
    }

    fn doc_path(&self, dir: &str, id: &str, ext: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.root.join(dir).join(format!("{id}.{ext}")))
    }

    fn entry_path(&self, namespace: &str, kind: &str, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self
            .root
            .join("index")
            .join(ns_dir(namespace)?)
            .join(kind)
            .join(id))
    }

    fn active_path(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.root.join("active").join(id))
    }

    /// Writes a document whole: a temporary file renamed over the old one, so a reader (or a crash) never
    /// leaves half of it.
    async fn write_doc<T: serde::Serialize + Sync>(path: PathBuf, doc: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(doc).map_err(|source| StoreError::Corrupt {
            path: path.display().to_string(),
            source,
        })?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        tokio::fs::write(&tmp, bytes).await.map_err(io(&tmp))?;
        tokio::fs::rename(&tmp, &path).await.map_err(io(&path))
    }

    async fn read_doc<T: serde::de::DeserializeOwned>(path: PathBuf) -> Result<Option<T>, StoreError> {
        match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    path: path.display().to_string(),
                    source,
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// The names in `dir` (none when it does not exist yet), each with what its entry holds when `sizes`.
    async fn names(dir: PathBuf, sizes: bool) -> Result<Vec<Listed>, StoreError> {
        let mut rd = match tokio::fs::read_dir(&dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir)(e)),
        };
        let mut out = Vec::new();
        while let Some(e) = rd.next_entry().await.map_err(io(&dir))? {
            let Some(id) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if check_id(&id).is_err() {
                continue;
            }
            let bytes = if sizes {
                // An entry holds a decimal size of a few bytes; anything else counts as nothing.
                let raw = tokio::fs::read(e.path()).await.unwrap_or_default();
                std::str::from_utf8(&raw)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0)
            } else {
                0
            };
            out.push(Listed { id, bytes });
        }
        newest_first(&mut out);
        Ok(out)
    }
}

/// Writes a small listing entry (created with its folder when missing).
fn write_entry(path: &Path, body: &[u8]) -> Result<(), StoreError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::write(path, body).map_err(io(path))
}

async fn write_entry_async(path: PathBuf, body: Vec<u8>) -> Result<(), StoreError> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
    }
    tokio::fs::write(&path, body).await.map_err(io(&path))
}

async fn remove_if_there(path: PathBuf) -> Result<(), StoreError> {
    match tokio::fs::remove_file(&path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path)(e)),
        _ => Ok(()),
    }
}

impl BatchStore for LocalStore {
    fn create_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataWriter, StoreError>> {
        Box::pin(async move {
            let p = self.data_path(id)?;
            let f = tokio::fs::File::create(&p).await.map_err(io(&p))?;
            Ok(Box::new(f) as DataWriter)
        })
    }

    fn append_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataWriter, StoreError>> {
        Box::pin(async move {
            let p = self.data_path(id)?;
            let f = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .await
                .map_err(io(&p))?;
            Ok(Box::new(f) as DataWriter)
        })
    }

    fn open_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<DataReader, StoreError>> {
        Box::pin(async move {
            let p = self.data_path(id)?;
            let f = tokio::fs::File::open(&p).await.map_err(io(&p))?;
            Ok(Box::new(f) as DataReader)
        })
    }

    fn data_len<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let p = self.data_path(id)?;
            match tokio::fs::metadata(&p).await {
                Ok(m) => Ok(m.len()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
                Err(e) => Err(io(&p)(e)),
            }
        })
    }

    fn truncate_data<'a>(&'a self, id: &'a str, len: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let p = self.data_path(id)?;
            let f = tokio::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .await
                .map_err(io(&p))?;
            f.set_len(len).await.map_err(io(&p))
        })
    }

    fn fence_data<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (p, copy) = (self.data_path(id)?, self.fence_path(id)?);
            // Copy, then rename over: the old inode stays open in any earlier writer and is unlinked here, so what
            // such a writer appends later is written nowhere anyone reads. The name always holds a whole file.
            match tokio::fs::copy(&p, &copy).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io(&copy)(e)),
            }
            tokio::fs::rename(&copy, &p).await.map_err(io(&p))
        })
    }

    fn delete_file<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            // Any part may be missing (an upload refused before its document was written): remove what is there,
            // the listing entry first, so a file is never listed without its document.
            if let Some(f) = Self::read_doc::<FileObject>(self.doc_path("files", id, "json")?).await? {
                remove_if_there(self.entry_path(&f.namespace, "files", id)?).await?;
            }
            for path in [
                self.doc_path("files", id, "json")?,
                self.data_path(id)?,
                self.fence_path(id)?,
            ] {
                remove_if_there(path).await?;
            }
            Ok(())
        })
    }

    fn put_file<'a>(&'a self, file: &'a FileObject) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            Self::write_doc(self.doc_path("files", &file.id, "json")?, file).await?;
            let entry = self.entry_path(&file.namespace, "files", &file.id)?;
            write_entry_async(entry, file.bytes.to_string().into_bytes()).await
        })
    }

    fn get_file<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<FileObject>, StoreError>> {
        Box::pin(async move { Self::read_doc(self.doc_path("files", id, "json")?).await })
    }

    fn list_files<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<Listed>, StoreError>> {
        Box::pin(async move {
            let dir = self.root.join("index").join(ns_dir(namespace)?).join("files");
            Self::names(dir, true).await
        })
    }

    fn put_batch<'a>(&'a self, batch: &'a BatchObject) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            // Listed before written (a listing skips an entry whose document is not there yet), and active until
            // the final document is on disk (a runner that finds an active entry of a final batch drops it).
            write_entry_async(
                self.entry_path(&batch.namespace, "batches", &batch.id)?,
                Vec::new(),
            )
            .await?;
            let final_ = batch.status.is_final();
            if !final_ {
                write_entry_async(self.active_path(&batch.id)?, Vec::new()).await?;
            }
            Self::write_doc(self.doc_path("batches", &batch.id, "json")?, batch).await?;
            if final_ {
                remove_if_there(self.active_path(&batch.id)?).await?;
            }
            Ok(())
        })
    }

    fn get_batch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<BatchObject>, StoreError>> {
        Box::pin(async move { Self::read_doc(self.doc_path("batches", id, "json")?).await })
    }

    fn list_batches<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<Listed>, StoreError>> {
        Box::pin(async move {
            let dir = self.root.join("index").join(ns_dir(namespace)?).join("batches");
            Self::names(dir, false).await
        })
    }

    fn active_batches(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let listed = Self::names(self.root.join("active"), false).await?;
            Ok(listed.into_iter().map(|l| l.id).collect())
        })
    }

    fn request_cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let p = self.doc_path("batches", id, "cancel")?;
            let mut f = tokio::fs::File::create(&p).await.map_err(io(&p))?;
            f.flush().await.map_err(io(&p))
        })
    }

    fn cancel_requested<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let p = self.doc_path("batches", id, "cancel")?;
            tokio::fs::try_exists(&p).await.map_err(io(&p))
        })
    }

    fn get_lease(&self) -> BoxFuture<'_, Result<Option<LeaseDoc>, StoreError>> {
        Box::pin(Self::read_doc(self.root.join("lease.json")))
    }

    fn put_lease<'a>(&'a self, lease: &'a LeaseDoc) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Self::write_doc(self.root.join("lease.json"), lease))
    }

    fn claim_lease_version<'a>(
        &'a self,
        version: u64,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let dir = self.root.join("lease-claims");
            tokio::fs::create_dir_all(&dir).await.map_err(io(&dir))?;
            let path = dir.join(version.to_string());
            // create_new is O_CREAT|O_EXCL: atomic on a local file system and on NFS v3 and later.
            match tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .await
            {
                Ok(mut f) => {
                    f.write_all(holder.as_bytes()).await.map_err(io(&path))?;
                    // Old claims say nothing any more: keep the last few.
                    if let Some(old) = version.checked_sub(8) {
                        let _ = tokio::fs::remove_file(dir.join(old.to_string())).await;
                    }
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(io(&path)(e)),
            }
        })
    }

    fn latest_lease_claim(&self) -> BoxFuture<'_, Result<Option<LeaseClaim>, StoreError>> {
        Box::pin(async move {
            let dir = self.root.join("lease-claims");
            let mut entries = match tokio::fs::read_dir(&dir).await {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io(&dir)(e)),
            };
            let mut latest: Option<u64> = None;
            // Claims are pruned to the last eight, so this listing stays short.
            while let Some(entry) = entries.next_entry().await.map_err(io(&dir))? {
                if let Some(v) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
                    latest = latest.max(Some(v));
                }
            }
            let Some(version) = latest else {
                return Ok(None);
            };
            let path = dir.join(version.to_string());
            let holder = match tokio::fs::read_to_string(&path).await {
                Ok(h) => h,
                // Pruned between the listing and the read: a newer claim exists, which the next look sees.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(io(&path)(e)),
            };
            Ok(Some(LeaseClaim { version, holder }))
        })
    }
}

/// A directory for a test's store, under the system temp dir, with a name no other process (nor a later run with
/// the same pid) shares.
#[cfg(test)]
pub(crate) fn scratch_dir(what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("tessera-{what}-{}-{nanos}", std::process::id()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    /// File data `id`, whole, as text.
    async fn read_all(store: &LocalStore, id: &str) -> String {
        let mut s = String::new();
        store
            .open_data(id)
            .await
            .unwrap()
            .read_to_string(&mut s)
            .await
            .unwrap();
        s
    }

    #[tokio::test]
    async fn a_writer_opened_before_a_fence_reaches_nothing_read_after_it() {
        let dir = scratch_dir("store-fence");
        let store = LocalStore::open(&dir).unwrap();
        // A runner's writer, and the answers it wrote before it was paused.
        let mut stale = store.append_data("out-1").await.unwrap();
        stale.write_all(b"a\n").await.unwrap();
        stale.flush().await.unwrap();
        // A taker fences the file, reads it and appends its own answers.
        store.fence_data("out-1").await.unwrap();
        assert_eq!(
            read_all(&store, "out-1").await,
            "a\n",
            "what reached the store before the fence is kept"
        );
        let mut taker = store.append_data("out-1").await.unwrap();
        taker.write_all(b"b\n").await.unwrap();
        taker.flush().await.unwrap();
        // The paused runner wakes with an answer still queued: it lands nowhere the taker reads.
        stale.write_all(b"b\n").await.unwrap();
        stale.flush().await.unwrap();
        assert_eq!(read_all(&store, "out-1").await, "a\nb\n");
        // Fencing data that does not exist yet leaves it missing; no copy is left behind.
        store.fence_data("out-2").await.unwrap();
        assert_eq!(store.data_len("out-2").await.unwrap(), 0);
        assert!(!dir.join("files/out-1.fence").exists());
    }

    #[tokio::test]
    async fn data_appends_and_truncates_and_ids_stay_inside() {
        let dir = scratch_dir("store");
        let store = LocalStore::open(&dir).unwrap();
        let mut w = store.append_data("out-1").await.unwrap();
        w.write_all(b"a\nb").await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(store.data_len("out-1").await.unwrap(), 3);
        store.truncate_data("out-1", 2).await.unwrap();
        assert_eq!(read_all(&store, "out-1").await, "a\n");
        assert!(matches!(store.get_file("../x").await, Err(StoreError::BadId(_))));
        assert!(store.get_batch("batch_none").await.unwrap().is_none());
        assert!(!store.cancel_requested("batch_x").await.unwrap());
        store.request_cancel("batch_x").await.unwrap();
        assert!(store.cancel_requested("batch_x").await.unwrap());
        assert!(store.claim_lease_version(1, "a").await.unwrap());
        assert!(
            !store.claim_lease_version(1, "b").await.unwrap(),
            "one version, one holder"
        );
        assert!(store.claim_lease_version(2, "b").await.unwrap());
        assert_eq!(
            store.latest_lease_claim().await.unwrap(),
            Some(LeaseClaim {
                version: 2,
                holder: "b".into()
            })
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
