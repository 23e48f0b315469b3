//! Artifact content on an S3-compatible object store ([`Blobs`] through the `object_store`
//! crate): `s3://BUCKET[/PREFIX]`, objects `[PREFIX/]{workspaceId or sessionId}/{artifactId}`
//! (seed 004's keys).
//!
//! Endpoint, region and credentials come from the usual `AWS_*` variables, as `object_store`'s
//! `AmazonS3Builder::from_env` reads them (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, ...).
//!
//! [`Blobs`] is synchronous and called from blocking threads (and plain threads); the HTTP
//! client lives on a runtime of its own, on one thread, as the PostgreSQL driver does, and a
//! caller waits for its operation on a channel, at most the operation time-out. So no async
//! worker is ever blocked on itself, and no operation hangs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{ClientConfigKey, ClientOptions, HttpClient, HttpConnector};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use super::StoreError;
use super::blobs::{BlobEntry, Blobs, check_key};

/// The bounds of every request to the object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S3Options {
    /// A connection attempt fails after this long.
    pub connect_timeout: Duration,
    /// One operation (with its retries) fails after this long.
    pub op_timeout: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(60),
        }
    }
}

/// Where the objects are: a bucket and an optional key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsUrl {
    /// The bucket's name.
    pub bucket: String,
    /// The keys' prefix (without a trailing `/`), if any.
    pub prefix: Option<String>,
}

/// Reads `s3://BUCKET[/PREFIX]`. The bucket is S3's bucket name (3 to 63 lowercase letters,
/// digits, `-` and `.`); the prefix is one or more `/`-separated parts of letters, digits,
/// `-`, `_` and `.` (none of them `.` or `..`).
pub fn parse_objects_url(url: &str) -> Result<ObjectsUrl, StoreError> {
    let bad = |why: &str| StoreError::Invalid(format!("`{url}` is not an object store URL: {why}"));
    let rest = url
        .trim()
        .strip_prefix("s3://")
        .ok_or_else(|| bad("expected s3://BUCKET or s3://BUCKET/PREFIX"))?;
    let (bucket, prefix) = match rest.split_once('/') {
        Some((bucket, prefix)) => (bucket, prefix.trim_end_matches('/')),
        None => (rest, ""),
    };
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !bucket.starts_with(['-', '.'])
        && !bucket.ends_with(['-', '.']);
    if !bucket_ok {
        return Err(bad(
            "the bucket must be 3 to 63 lowercase letters, digits, `-` and `.`",
        ));
    }
    let prefix = if prefix.is_empty() {
        None
    } else {
        let part_ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        };
        if !prefix.split('/').all(part_ok) {
            return Err(bad(
                "the prefix must be parts of letters, digits, `-`, `_` and `.` separated by `/`",
            ));
        }
        Some(prefix.to_owned())
    };
    Ok(ObjectsUrl {
        bucket: bucket.to_owned(),
        prefix,
    })
}

/// The HTTP client of the object store: reqwest on rustls with ring (the workspace never builds
/// aws-lc-rs), with the time-outs given here, plain HTTP only when `AWS_ALLOW_HTTP` says so.
#[derive(Debug)]
struct Connector {
    options: S3Options,
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let generic = |e: String| object_store::Error::Generic {
            store: "S3",
            source: e.into(),
        };
        let allow_http = options
            .get_config_value(&ClientConfigKey::AllowHttp)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let client = crate::llm::http_client_builder()
            .map_err(|e| generic(e.to_string()))?
            .https_only(!allow_http)
            .connect_timeout(self.options.connect_timeout)
            .timeout(self.options.op_timeout)
            .build()
            .map_err(|e| generic(e.to_string()))?;
        Ok(HttpClient::new(client))
    }
}

/// The thread that drives the HTTP client, and a way to run work on it.
struct Driver {
    handle: tokio::runtime::Handle,
    /// Dropping it ends the driver thread (and the runtime, on that thread).
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Driver {
    fn start() -> Result<Driver, StoreError> {
        let fail = |e: std::io::Error| {
            StoreError::Objects(format!("cannot start the object store client: {e}"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(fail)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("objects".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(fail)?;
        Ok(Driver {
            handle,
            _stop: stop,
        })
    }

    /// Runs `work` on the driver thread and waits for it, at most `limit`.
    fn run<T, Fut>(&self, what: String, limit: Duration, work: Fut) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let out = match tokio::time::timeout(limit, work).await {
                Ok(out) => out,
                Err(_) => Err(StoreError::Objects(format!(
                    "{what} took longer than {limit:?}"
                ))),
            };
            let _ = tx.send(out);
        });
        let wait = move || {
            rx.recv().unwrap_or_else(|_| {
                Err(StoreError::Objects(
                    "the object store client stopped during an operation".into(),
                ))
            })
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
    }
}

/// Blobs as objects in an S3 bucket.
pub struct S3Blobs {
    store: Arc<AmazonS3>,
    prefix: Option<String>,
    driver: Driver,
    options: S3Options,
    name: String,
}

impl std::fmt::Debug for S3Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Blobs")
            .field("objects", &self.name)
            .finish_non_exhaustive()
    }
}

/// An object store error on one line, with its causes.
fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !out.contains(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = s.source();
    }
    out
}

impl S3Blobs {
    /// The objects at `url` (see [`parse_objects_url`]), configured from the `AWS_*` entries of
    /// `vars` (the process environment for the server). Checks that the bucket can be listed
    /// before returning, so a missing bucket, refused credentials or an unreachable endpoint
    /// fail here with a clear error, within the time-outs of `options`.
    pub fn connect(
        url: &str,
        vars: impl IntoIterator<Item = (String, String)>,
        options: S3Options,
    ) -> Result<S3Blobs, StoreError> {
        let parsed = parse_objects_url(url)?;
        let mut builder = AmazonS3Builder::new();
        let mut endpoint = None;
        for (key, value) in vars {
            if !key.starts_with("AWS_") {
                continue;
            }
            if let Ok(config) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                if config == AmazonS3ConfigKey::Endpoint {
                    endpoint = Some(value.clone());
                }
                builder = builder.with_config(config, value);
            }
        }
        let store = builder
            .with_bucket_name(&parsed.bucket)
            .with_http_connector(Connector { options })
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: options.op_timeout,
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| {
                StoreError::Invalid(format!("the object store {url}: {}", describe(&e)))
            })?;
        let name = match &endpoint {
            Some(endpoint) => format!("{} at {endpoint}", url.trim()),
            None => url.trim().to_owned(),
        };
        let blobs = S3Blobs {
            store: Arc::new(store),
            prefix: parsed.prefix,
            driver: Driver::start()?,
            options,
            name,
        };
        // The bucket answers a listing: it exists, the credentials are accepted, the endpoint is
        // reachable.
        let store = blobs.store.clone();
        let prefix = blobs.prefix.clone().map(ObjectPath::from);
        blobs
            .driver
            .run(
                format!("reaching {}", blobs.name),
                options.connect_timeout + options.op_timeout,
                async move {
                    store
                        .list_with_delimiter(prefix.as_ref())
                        .await
                        .map(|_| ())
                        .map_err(|e| StoreError::Objects(describe(&e)))
                },
            )
            .map_err(|e| StoreError::Objects(format!("cannot use {}: {e}", blobs.name)))?;
        Ok(blobs)
    }

    /// The URL (and the endpoint, when one is set); never a credential.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The object of `key` (checked as [`check_key`] does).
    fn path(&self, key: &str) -> Result<ObjectPath, StoreError> {
        check_key(key)?;
        Ok(match &self.prefix {
            Some(prefix) => ObjectPath::from(format!("{prefix}/{key}")),
            None => ObjectPath::from(key),
        })
    }

    fn run<T, Fut>(&self, what: String, work: Fut) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Fut: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        let name = self.name.clone();
        let message = what.clone();
        self.driver.run(what, self.options.op_timeout, async move {
            work.await
                .map_err(|e| StoreError::Objects(format!("{message} ({name}): {}", describe(&e))))
        })
    }
}

impl Blobs for S3Blobs {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let store = self.store.clone();
        let payload = PutPayload::from(bytes.to_vec());
        // S3 acknowledges a PUT once the object is stored durably.
        self.run(format!("writing {key}"), async move {
            store.put(&path, payload).await.map(|_| ())
        })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key)?;
        let store = self.store.clone();
        self.run(format!("reading {key}"), async move {
            match store.get(&path).await {
                Ok(result) => result.bytes().await.map(|b| Some(b.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let store = self.store.clone();
        self.run(format!("deleting {key}"), async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    /// In the bucket's order of object names (S3 lists them so); the cursor is the last
    /// object's whole name, listed on from with `start-after`, each page one operation.
    fn list_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BlobEntry>, Option<String>), StoreError> {
        let store = self.store.clone();
        let root = self.prefix.clone().map(ObjectPath::from);
        let offset = cursor
            .map(ObjectPath::parse)
            .transpose()
            .map_err(|e| StoreError::Invalid(format!("a listing's cursor: {e}")))?;
        let limit = limit.max(1);
        let listed: Vec<(String, SystemTime)> =
            self.run("listing the objects".into(), async move {
                let mut stream = match &offset {
                    Some(offset) => store.list_with_offset(root.as_ref(), offset),
                    None => store.list(root.as_ref()),
                };
                let mut out = Vec::new();
                while out.len() < limit
                    && let Some(meta) = stream.next().await
                {
                    let meta = meta?;
                    out.push((
                        meta.location.to_string(),
                        SystemTime::from(meta.last_modified),
                    ));
                }
                Ok(out)
            })?;
        let next = (listed.len() == limit)
            .then(|| listed.last().map(|(location, _)| location.clone()))
            .flatten();
        let strip = self.prefix.as_ref().map(|p| format!("{p}/"));
        let entries = listed
            .into_iter()
            .filter_map(|(location, modified)| {
                let key = match &strip {
                    Some(p) => location.strip_prefix(p.as_str())?.to_owned(),
                    None => location,
                };
                // Objects that are no blob key (put there by something else) are not ours.
                check_key(&key).ok()?;
                Some(BlobEntry { key, modified })
            })
            .collect();
        Ok((entries, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_url_names_a_bucket_and_an_optional_prefix() {
        assert_eq!(
            parse_objects_url("s3://monad-artifacts").unwrap(),
            ObjectsUrl {
                bucket: "monad-artifacts".into(),
                prefix: None
            }
        );
        assert_eq!(
            parse_objects_url("s3://bkt/team/prod/").unwrap(),
            ObjectsUrl {
                bucket: "bkt".into(),
                prefix: Some("team/prod".into())
            }
        );
        for bad in [
            "",
            "bkt",
            "http://bkt/x",
            "s3://",
            "s3://B",
            "s3://Upper",
            "s3://ab",
            "s3://-bkt",
            "s3://bkt/../x",
            "s3://bkt/a//b",
            "s3://bkt/a b",
            "s3://bkt/.",
        ] {
            let e = parse_objects_url(bad).unwrap_err().to_string();
            assert!(e.contains("not an object store URL"), "{bad}: {e}");
        }
    }
}
