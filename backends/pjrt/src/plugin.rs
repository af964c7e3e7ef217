//! Loading a PJRT plugin (`dlopen` + `GetPjrtApi` + `PJRT_Plugin_Initialize`),
//! version checks, plugin path discovery, and the checked call machinery used
//! by every other module.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::named::NamedValue;

/// Calls a function of the plugin's `PJRT_Api` table with a pointer to its
/// args struct, checking first that the plugin's table is large enough to
/// hold the entry and that it is non-null. Evaluates to `Result<()>`; a
/// returned `PJRT_Error` is converted (and destroyed).
macro_rules! pjrt_call {
    ($plugin:expr, $func:ident, $args:expr) => {{
        let plugin: &$crate::plugin::Plugin = $plugin;
        let offset = ::std::mem::offset_of!($crate::ffi::PJRT_Api, $func);
        match plugin.entry_present(offset, stringify!($func)) {
            Err(e) => Err(e),
            // SAFETY: the entry lies inside the plugin's table (checked above).
            Ok(()) => match unsafe { ::std::ptr::addr_of!((*plugin.raw_api()).$func).read() } {
                None => Err(plugin.missing(stringify!($func))),
                Some(f) => {
                    // SAFETY: the entry lies inside the plugin's table and is
                    // non-null; `$args` points to a correctly sized args struct.
                    let err = unsafe { f($args) };
                    plugin.check(err, stringify!($func))
                }
            },
        }
    }};
}
pub(crate) use pjrt_call;

/// A PJRT C API version (`PJRT_Api_Version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// ABI-breaking version; must match the header's.
    pub major: i32,
    /// Additive version.
    pub minor: i32,
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The API version of the header the bindings were generated from.
pub const HEADER_API_VERSION: ApiVersion = ApiVersion {
    major: ffi::PJRT_API_MAJOR as i32,
    minor: ffi::PJRT_API_MINOR as i32,
};

struct PluginInner {
    /// The plugin's table; may be shorter than this header's `PJRT_Api`
    /// (older plugin), so fields are only read after checking `struct_size`.
    api: *const ffi::PJRT_Api,
    struct_size: usize,
    path: PathBuf,
    version: ApiVersion,
}

/// A loaded and initialized PJRT plugin. Cheap to clone; `Send + Sync`.
///
/// The shared library is never unloaded (XLA plugins do not survive
/// `dlclose`), and loading the same path twice returns the same plugin
/// without initializing it again.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

// SAFETY: the `PJRT_Api` table is an immutable, process-lifetime table of C
// function pointers; PJRT documents its functions as callable from any thread.
// Objects created through it (clients, buffers, ...) are not `Send`.
unsafe impl Send for PluginInner {}
unsafe impl Sync for PluginInner {}

fn registry() -> &'static Mutex<HashMap<PathBuf, Plugin>> {
    static REG: OnceLock<Mutex<HashMap<PathBuf, Plugin>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Plugin {
    /// Loads the plugin at `path`: `dlopen`, `GetPjrtApi`, checks that the API
    /// major version matches the header's and that the function table is large
    /// enough, then calls `PJRT_Plugin_Initialize`.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(Error::PluginNotFound {
                path: path.to_path_buf(),
                fix: format!(
                    "Point {PLUGIN_ENV} at a PJRT plugin .so, or run scripts/setup.sh to install the pinned xla_cpu_pjrt wheel into .venv"
                ),
            });
        }
        let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = reg.get(&key) {
            return Ok(p.clone());
        }
        let plugin = Self::load_uncached(&key)?;
        reg.insert(key, plugin.clone());
        Ok(plugin)
    }

    /// Loads the plugin found by [`default_plugin_path`].
    pub fn load_default() -> Result<Plugin> {
        Self::load(default_plugin_path()?)
    }

    fn load_uncached(path: &Path) -> Result<Plugin> {
        let load_err = |message: String| Error::PluginLoad {
            path: path.to_path_buf(),
            message,
        };
        // A file cut short would be mapped past its end: SIGBUS, naming no file.
        crate::elf::check_complete(path).map_err(load_err)?;
        // SAFETY: loading a shared library runs its initializers; PJRT plugins
        // are designed to be dlopen'ed.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_err(e.to_string()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api: ffi::GetPjrtApiFn = unsafe {
            *lib.get::<ffi::GetPjrtApiFn>(b"GetPjrtApi\0")
                .map_err(|e| load_err(format!("no GetPjrtApi symbol: {e}")))?
        };
        // SAFETY: plain call of the plugin's entry point.
        let api_ptr = unsafe { get_api() };
        if api_ptr.is_null() {
            return Err(load_err("GetPjrtApi returned null".into()));
        }
        // Keep the library mapped for the life of the process.
        std::mem::forget(lib);
        // SAFETY: non-null; every PJRT_Api starts with `struct_size`.
        let struct_size = unsafe { std::ptr::addr_of!((*api_ptr).struct_size).read() };

        let incompatible = |message: String| Error::Incompatible {
            path: path.to_path_buf(),
            message,
        };
        // Everything up to and including PJRT_Plugin_Initialize must be present.
        let min_size = std::mem::offset_of!(ffi::PJRT_Api, PJRT_Plugin_Attributes);
        if struct_size < min_size {
            return Err(incompatible(format!(
                "PJRT_Api struct_size {struct_size} is smaller than the minimum {min_size}"
            )));
        }
        // SAFETY: the table is at least `min_size` bytes, which covers the version.
        let v = unsafe { std::ptr::addr_of!((*api_ptr).pjrt_api_version).read() };
        if v.struct_size < ffi::PJRT_Api_Version_STRUCT_SIZE as usize {
            return Err(incompatible(format!(
                "PJRT_Api_Version struct_size {} < {}",
                v.struct_size,
                ffi::PJRT_Api_Version_STRUCT_SIZE
            )));
        }
        let version = ApiVersion {
            major: v.major_version,
            minor: v.minor_version,
        };
        if version.major != HEADER_API_VERSION.major {
            return Err(incompatible(format!(
                "plugin implements PJRT C API {version}, these bindings were generated for {HEADER_API_VERSION} (major versions must match)"
            )));
        }
        let plugin = Plugin {
            inner: Arc::new(PluginInner {
                api: api_ptr,
                struct_size,
                path: path.to_path_buf(),
                version,
            }),
        };
        let mut args = ffi::PJRT_Plugin_Initialize_Args {
            struct_size: ffi::PJRT_Plugin_Initialize_Args_STRUCT_SIZE as usize,
            ..Default::default()
        };
        pjrt_call!(&plugin, PJRT_Plugin_Initialize, &mut args)?;
        Ok(plugin)
    }

    /// The API version the plugin reports.
    pub fn api_version(&self) -> ApiVersion {
        self.inner.version
    }

    /// `struct_size` of the plugin's `PJRT_Api` table (compare with
    /// [`header_api_struct_size`]); entries beyond it are reported as
    /// [`Error::MissingFunction`].
    pub fn api_struct_size(&self) -> usize {
        self.inner.struct_size
    }

    /// The path the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Plugin attributes (`PJRT_Plugin_Attributes`), e.g. `xla_version`,
    /// `stablehlo_current_version`.
    pub fn attributes(&self) -> Result<Vec<NamedValue>> {
        let mut args = ffi::PJRT_Plugin_Attributes_Args {
            struct_size: ffi::PJRT_Plugin_Attributes_Args_STRUCT_SIZE as usize,
            ..Default::default()
        };
        pjrt_call!(self, PJRT_Plugin_Attributes, &mut args)?;
        // SAFETY: the plugin returns `num_attributes` values living for the process.
        Ok(unsafe { crate::named::from_raw_list(args.attributes, args.num_attributes) })
    }

    pub(crate) fn raw_api(&self) -> *const ffi::PJRT_Api {
        self.inner.api
    }

    /// Checks that a table entry at `offset` lies inside the plugin's table.
    pub(crate) fn entry_present(&self, offset: usize, function: &'static str) -> Result<()> {
        let end = offset + std::mem::size_of::<usize>();
        if end <= self.inner.struct_size {
            Ok(())
        } else {
            Err(self.missing(function))
        }
    }

    pub(crate) fn missing(&self, function: &'static str) -> Error {
        Error::MissingFunction {
            function,
            major: self.inner.version.major,
            minor: self.inner.version.minor,
        }
    }

    /// Converts a returned `PJRT_Error*` into a `Result`, always destroying it.
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error, function: &'static str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        // SAFETY: the error functions precede PJRT_Plugin_Attributes, which
        // `load` checked is inside the table.
        let api = self.inner.api;
        let (msg_fn, code_fn) = unsafe {
            (
                std::ptr::addr_of!((*api).PJRT_Error_Message).read(),
                std::ptr::addr_of!((*api).PJRT_Error_GetCode).read(),
            )
        };
        let mut message = String::new();
        if let Some(f) = msg_fn {
            let mut m = ffi::PJRT_Error_Message_Args {
                struct_size: ffi::PJRT_Error_Message_Args_STRUCT_SIZE as usize,
                error: err,
                ..Default::default()
            };
            // SAFETY: `err` is a live error; the message lives as long as it.
            unsafe {
                f(&mut m);
                message = crate::named::string_from_raw(m.message, m.message_size);
            }
        }
        let mut code = ErrorCode::Unknown;
        if let Some(f) = code_fn {
            let mut c = ffi::PJRT_Error_GetCode_Args {
                struct_size: ffi::PJRT_Error_GetCode_Args_STRUCT_SIZE as usize,
                error: err,
                ..Default::default()
            };
            // SAFETY: `err` is live.
            let e2 = unsafe { f(&mut c) };
            if e2.is_null() {
                code = ErrorCode::from_raw(c.code);
            } else {
                self.destroy_error(e2);
            }
        }
        self.destroy_error(err);
        Err(Error::Pjrt {
            function,
            code,
            message,
        })
    }

    pub(crate) fn destroy_error(&self, err: *mut ffi::PJRT_Error) {
        // SAFETY: inside the table, see `check`.
        if let Some(f) = unsafe { std::ptr::addr_of!((*self.inner.api).PJRT_Error_Destroy).read() }
        {
            let mut d = ffi::PJRT_Error_Destroy_Args {
                struct_size: ffi::PJRT_Error_Destroy_Args_STRUCT_SIZE as usize,
                error: err,
                ..Default::default()
            };
            // SAFETY: `err` is owned by us and destroyed exactly once.
            unsafe { f(&mut d) };
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &self.inner.version)
            .finish()
    }
}

/// `PJRT_Api_STRUCT_SIZE` of the header the bindings were generated from.
pub fn header_api_struct_size() -> usize {
    ffi::PJRT_Api_STRUCT_SIZE as usize
}

/// Environment variable naming the plugin to load; overrides discovery.
pub const PLUGIN_ENV: &str = "GRPO_PJRT_PLUGIN";

const PLUGIN_IN_WHEEL: &str = "site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";

/// Finds the PJRT plugin: env `GRPO_PJRT_PLUGIN` if set (it must exist), else
/// `<workspace>/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so`
/// where `<workspace>` is the workspace this crate was built in. A missing
/// plugin is an [`Error::PluginNotFound`] naming the path tried and the fix.
pub fn default_plugin_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(PLUGIN_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::PluginNotFound {
                path: p,
                fix: format!("{PLUGIN_ENV} names a file that does not exist; fix or unset it"),
            })
        };
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let venv_lib = root.join(".venv").join("lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&venv_lib)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join(PLUGIN_IN_WHEEL))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().ok_or_else(|| Error::PluginNotFound {
        path: venv_lib.join("python3*").join(PLUGIN_IN_WHEEL),
        fix: format!("Run scripts/setup.sh (installs the pinned xla_cpu_pjrt wheel), or set {PLUGIN_ENV}=/path/to/plugin.so"),
    })
}
