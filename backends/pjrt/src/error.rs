//! Error type: every fallible call returns [`Result`]; plugin errors carry the
//! plugin's own message and status code, and the `PJRT_Error` is always
//! destroyed before the Rust error is returned.

use std::path::PathBuf;

/// Status code of a PJRT error (the absl status codes of `PJRT_Error_Code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// `PJRT_Error_Code_CANCELLED`.
    Cancelled,
    /// `PJRT_Error_Code_UNKNOWN`.
    Unknown,
    /// `PJRT_Error_Code_INVALID_ARGUMENT`.
    InvalidArgument,
    /// `PJRT_Error_Code_DEADLINE_EXCEEDED`.
    DeadlineExceeded,
    /// `PJRT_Error_Code_NOT_FOUND`.
    NotFound,
    /// `PJRT_Error_Code_ALREADY_EXISTS`.
    AlreadyExists,
    /// `PJRT_Error_Code_PERMISSION_DENIED`.
    PermissionDenied,
    /// `PJRT_Error_Code_RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// `PJRT_Error_Code_FAILED_PRECONDITION`.
    FailedPrecondition,
    /// `PJRT_Error_Code_ABORTED`.
    Aborted,
    /// `PJRT_Error_Code_OUT_OF_RANGE`.
    OutOfRange,
    /// `PJRT_Error_Code_UNIMPLEMENTED`.
    Unimplemented,
    /// `PJRT_Error_Code_INTERNAL`.
    Internal,
    /// `PJRT_Error_Code_UNAVAILABLE`.
    Unavailable,
    /// `PJRT_Error_Code_DATA_LOSS`.
    DataLoss,
    /// `PJRT_Error_Code_UNAUTHENTICATED`.
    Unauthenticated,
    /// A code this crate does not know (raw value).
    Other(u32),
}

impl ErrorCode {
    /// Maps the raw `PJRT_Error_Code` value.
    pub fn from_raw(code: u32) -> Self {
        match code {
            1 => Self::Cancelled,
            2 => Self::Unknown,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            other => Self::Other(other),
        }
    }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error returned by the plugin (message from `PJRT_Error_Message`,
    /// code from `PJRT_Error_GetCode`).
    #[error("{function} failed ({code:?}): {message}")]
    Pjrt {
        /// The C API function that failed, e.g. `PJRT_Client_Compile`.
        function: &'static str,
        /// The plugin's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// The plugin's function table has no entry for this function (older
    /// plugin, or a null entry).
    #[error("{function} is not provided by the plugin (plugin PJRT C API {major}.{minor})")]
    MissingFunction {
        /// The C API function.
        function: &'static str,
        /// Plugin API major version.
        major: i32,
        /// Plugin API minor version.
        minor: i32,
    },
    /// The plugin shared library does not exist.
    #[error("PJRT plugin not found: {path}. {fix}")]
    PluginNotFound {
        /// Path(s) tried.
        path: PathBuf,
        /// How to fix it.
        fix: String,
    },
    /// dlopen or symbol lookup failed.
    #[error("cannot load PJRT plugin {path}: {message}")]
    PluginLoad {
        /// The plugin path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The plugin's API version or struct sizes are incompatible with the header
    /// these bindings were generated from.
    #[error("incompatible PJRT plugin {path}: {message}")]
    Incompatible {
        /// The plugin path.
        path: PathBuf,
        /// What is incompatible.
        message: String,
    },
    /// A caller error detected before calling into the plugin.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An error while encoding the compile options protobuf.
    #[error("cannot encode compile options: {0}")]
    Encode(#[from] prost::EncodeError),
}

impl Error {
    /// The plugin's status code, if this error came from the plugin.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the plugin says `UNIMPLEMENTED` or does not provide the function.
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, Error::MissingFunction { .. })
            || self.code() == Some(ErrorCode::Unimplemented)
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns "unimplemented" into `Ok(None)`, keeps other errors.
pub(crate) fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_unimplemented() => Ok(None),
        Err(e) => Err(e),
    }
}
