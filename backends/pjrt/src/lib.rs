//! `grpo-pjrt`: the project's own Rust binding of the PJRT C API.
//!
//! Raw bindings ([`ffi`]) are generated at build time by bindgen from the
//! `pjrt_c_api.h` shipped in the pinned `xla_cpu_pjrt` wheel; the rest of the
//! crate is a small safe wrapper: load a [`Plugin`], create a [`Client`],
//! compile a [`Program`] with [`CompileOptions`], move data with [`Buffer`],
//! run a [`LoadedExecutable`] on one or many devices, read compiled memory
//! stats and cost analysis, and compile deviceless against a [`Topology`].
//!
//! Thread model: [`Plugin`] is `Send + Sync`; everything made from a
//! [`Client`] is neither (it shares the client through an `Rc`), so use one
//! client per thread.
#![warn(missing_docs)]

pub mod ffi;
pub mod hlo;
pub mod proto;

mod buffer;
mod client;
mod compile;
mod device;
mod elf;
mod error;
mod event;
mod executable;
mod named;
mod plugin;
mod topology;
mod types;

pub use buffer::Buffer;
pub use client::{Client, ClientOptions};
pub use compile::{CompileOptions, DeviceAssignment, Program};
pub use device::{Device, DeviceDescription, DeviceMemoryStats};
pub use error::{Error, ErrorCode, Result};
pub use event::{wait_all, Event};
pub use executable::{CompiledMemoryStats, CostAnalysis, Executable, Execution, LoadedExecutable};
pub use named::{NamedValue, Value};
pub use plugin::{
    default_plugin_path, header_api_struct_size, ApiVersion, Plugin, HEADER_API_VERSION, PLUGIN_ENV,
};
pub use topology::Topology;
pub use types::{Bf16, ElementType, NativeType, F16};
