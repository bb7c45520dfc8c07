//! The engine's one error type. Every variant names the option, shard, row or field at fault so
//! that the message alone tells a user what to fix; the Python binding maps each variant to one
//! class of the documented exception hierarchy.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Once;

/// Result alias used across the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid; `option` is its path in the config (`stages[0].batch_size`).
    #[error("invalid {option}: {message}")]
    Config {
        /// Dotted path of the option at fault.
        option: String,
        /// What is wrong with it and what is accepted.
        message: String,
    },
    /// A shard, manifest or other object does not exist.
    #[error("{path}: not found")]
    NotFound {
        /// Location of the missing object.
        path: String,
    },
    /// Reading or writing an object failed for a reason other than its absence.
    #[error("{path}: {source}")]
    Io {
        /// Location of the object.
        path: String,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// Object storage failed: retries ran out, the object changed while being read, or the
    /// server answered something the engine cannot recover from.
    #[error("{path}: {message}")]
    Storage {
        /// Location of the object.
        path: String,
        /// What failed, with the last cause.
        message: String,
    },
    /// The storage service refused the credentials or the permission for an object.
    #[error("{path}: access denied: {message}")]
    AccessDenied {
        /// Location of the object.
        path: String,
        /// The service's answer.
        message: String,
    },
    /// A create-only write found a different object already at its location.
    #[error("{path}: {message}")]
    Conflict {
        /// Location of the object.
        path: String,
        /// What differs.
        message: String,
    },
    /// A shard is malformed: it cannot be decoded as its declared encoding.
    #[error("{path}{}: malformed {encoding} shard: {message}", RowSuffix(*row))]
    Format {
        /// Location of the shard.
        path: String,
        /// Encoding the shard was read as.
        encoding: &'static str,
        /// Row (record index within the shard) where decoding failed, when known.
        row: Option<u64>,
        /// What was wrong.
        message: String,
    },
    /// A shard is well formed but uses a feature this build cannot read (a compression codec
    /// such as LZO): not a malformed shard, and not fixed by retrying.
    #[error("{path}: unsupported {encoding} feature: {message}")]
    Unsupported {
        /// Location of the shard.
        path: String,
        /// Encoding the shard was read as.
        encoding: &'static str,
        /// What is not supported, by name.
        message: String,
    },
    /// Records given to a writer cannot be stored in the shard's encoding (a NaN in JSON).
    #[error("{path}{}{}: {message}", RecordSuffix(*row), FieldSuffix(field.as_deref()))]
    Data {
        /// Location of the shard being written.
        path: String,
        /// Index of the record among those written, when one record is at fault.
        row: Option<u64>,
        /// Path of the value within the record (`tokens[3]`), when one value is at fault.
        field: Option<String>,
        /// What was wrong.
        message: String,
    },
    /// A record's value does not fit the projected field (wrong type, too deeply nested, null).
    #[error("{path}, row {row}, field '{field}' (source '{source_field}'): {message}")]
    Projection {
        /// Location of the shard.
        path: String,
        /// Row (record index within the shard).
        row: u64,
        /// Projected field name.
        field: String,
        /// Record field the projection reads.
        source_field: String,
        /// What was wrong.
        message: String,
    },
    /// A checkpoint cannot be used: corrupt, from another version, rank or file list.
    #[error("checkpoint refused: {message}")]
    Checkpoint {
        /// Why.
        message: String,
    },
    /// The stream was used after `close()`.
    #[error("the batch stream is closed")]
    Closed,
    /// A bug in the engine (a panic caught at a thread boundary), reported instead of aborting.
    #[error("internal error: {message}; please report it")]
    Internal {
        /// What failed.
        message: String,
    },
    /// Work was stopped by `close()` or an interrupt before it finished.
    #[error("{what}: cancelled")]
    Cancelled {
        /// What was stopped (an object's location, or the operation).
        what: String,
    },
}

struct RowSuffix(Option<u64>);

impl fmt::Display for RowSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(row) => write!(f, ", row {row}"),
            None => Ok(()),
        }
    }
}

struct RecordSuffix(Option<u64>);

impl fmt::Display for RecordSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(row) => write!(f, ", record {row}"),
            None => Ok(()),
        }
    }
}

struct FieldSuffix<'a>(Option<&'a str>);

impl fmt::Display for FieldSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(field) => write!(f, ", field '{field}'"),
            None => Ok(()),
        }
    }
}

/// A panic's message.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".to_owned())
}

thread_local! {
    /// Set while this thread runs code under [`catch_quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// Where this thread's last quiet panic happened, for its error message.
    static QUIET_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

static QUIET_HOOK: Once = Once::new();

/// Runs `f`, turning a panic into its message and where it happened, without the panic being
/// printed. For decoders that panic on malformed input where they should return an error
/// (arrow-rs asserts on some corrupt Parquet pages): such a panic is the input's fault and
/// reaches the user as an error naming the input, so the standard hook's stderr report (a
/// backtrace, with `RUST_BACKTRACE` set) would only look like a crash. The hook installed here
/// passes every other panic, on any thread, to the hook it replaced; a hook installed later
/// replaces it, and such panics are printed again.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let at = info.location().map(|l| {
                    // The crate-relative path: a dependency's location is absolute under the
                    // registry, which says nothing more.
                    let file = l.file();
                    let from = file
                        .rfind("/src/")
                        .and_then(|i| file[..i].rfind('/').map(|j| j + 1))
                        .unwrap_or(0);
                    format!("{}:{}:{}", &file[from..], l.line(), l.column())
                });
                QUIET_LOCATION.with(|slot| *slot.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
    let outer = QUIET.with(|q| q.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(outer));
    outcome.map_err(|panic| {
        let message = panic_message(panic.as_ref());
        match QUIET_LOCATION.with(|slot| slot.borrow_mut().take()) {
            Some(at) => format!("{message} (at {at})"),
            None => message,
        }
    })
}

impl Error {
    /// The error for a panic caught at a thread boundary: a bug reported with its cause, never an
    /// abort or a silent end of a stream.
    pub fn from_panic(panic: &(dyn std::any::Any + Send)) -> Self {
        Error::Internal {
            message: format!("an engine thread panicked: {}", panic_message(panic)),
        }
    }

    /// Runs `f`, turning a panic into [`Error::Internal`].
    pub fn catch<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|panic| Err(Error::from_panic(panic.as_ref())))
    }

    /// Builds a [`Error::Config`] error.
    pub fn config(option: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            option: option.into(),
            message: message.into(),
        }
    }

    /// Maps an I/O error on `path`, keeping "not found" distinct so callers can fail closed on it.
    pub fn io(path: &str, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound {
                path: path.to_owned(),
            }
        } else if source.raw_os_error() == Some(libc::ELOOP) {
            // The OS's "too many levels of symbolic links", said as what it is.
            Error::Io {
                path: path.to_owned(),
                source: std::io::Error::new(source.kind(), "a loop of symbolic links, not a file"),
            }
        } else {
            Error::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}
