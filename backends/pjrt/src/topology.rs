//! `PJRT_TopologyDescription` and deviceless compilation (`PJRT_Compile`),
//! e.g. compiling for a TPU topology with libtpu on a machine without TPUs.

use std::rc::Rc;

use crate::client::ClientInner;
use crate::compile::{CompileOptions, Program};
use crate::device::DeviceDescription;
use crate::error::Result;
use crate::executable::Executable;
use crate::ffi;
use crate::named::{from_raw_list, string_from_raw, NamedValue, RawNamedValues};
use crate::plugin::{pjrt_call, Plugin};

/// A topology description. Owned ones (from [`Topology::create`]) are
/// destroyed on drop; a client's topology is owned by the client.
pub struct Topology {
    plugin: Plugin,
    raw: *mut ffi::PJRT_TopologyDescription,
    owned: bool,
    _client: Option<Rc<ClientInner>>,
}

impl Topology {
    /// Creates a topology without a client (`PJRT_TopologyDescription_Create`),
    /// e.g. name `"v5e:2x2"` for libtpu. Plugins that do not support it return
    /// their error (often `UNIMPLEMENTED`).
    pub fn create(plugin: &Plugin, name: &str, options: &[NamedValue]) -> Result<Topology> {
        let raw_opts = RawNamedValues::new(options);
        let mut args = ffi::PJRT_TopologyDescription_Create_Args {
            struct_size: ffi::PJRT_TopologyDescription_Create_Args_STRUCT_SIZE as usize,
            topology_name: name.as_ptr().cast(),
            topology_name_size: name.len(),
            create_options: raw_opts.as_ptr(),
            num_options: raw_opts.len(),
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_TopologyDescription_Create, &mut args)?;
        Ok(Topology {
            plugin: plugin.clone(),
            raw: args.topology,
            owned: true,
            _client: None,
        })
    }

    pub(crate) fn borrowed_from_client(
        client: &Rc<ClientInner>,
        raw: *mut ffi::PJRT_TopologyDescription,
    ) -> Self {
        Topology {
            plugin: client.plugin.clone(),
            raw,
            owned: false,
            _client: Some(client.clone()),
        }
    }

    /// Platform name of the topology.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_TopologyDescription_PlatformName_Args {
            struct_size: ffi::PJRT_TopologyDescription_PlatformName_Args_STRUCT_SIZE as usize,
            topology: self.raw,
            ..Default::default()
        };
        pjrt_call!(
            &self.plugin,
            PJRT_TopologyDescription_PlatformName,
            &mut args
        )?;
        // SAFETY: owned by the topology.
        Ok(unsafe { string_from_raw(args.platform_name, args.platform_name_size) })
    }

    /// Platform version of the topology.
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_TopologyDescription_PlatformVersion_Args {
            struct_size: ffi::PJRT_TopologyDescription_PlatformVersion_Args_STRUCT_SIZE as usize,
            topology: self.raw,
            ..Default::default()
        };
        pjrt_call!(
            &self.plugin,
            PJRT_TopologyDescription_PlatformVersion,
            &mut args
        )?;
        // SAFETY: owned by the topology.
        Ok(unsafe { string_from_raw(args.platform_version, args.platform_version_size) })
    }

    /// Descriptions of the topology's devices.
    pub fn device_descriptions(&self) -> Result<Vec<DeviceDescription>> {
        let mut args = ffi::PJRT_TopologyDescription_GetDeviceDescriptions_Args {
            struct_size: ffi::PJRT_TopologyDescription_GetDeviceDescriptions_Args_STRUCT_SIZE
                as usize,
            topology: self.raw,
            ..Default::default()
        };
        pjrt_call!(
            &self.plugin,
            PJRT_TopologyDescription_GetDeviceDescriptions,
            &mut args
        )?;
        if args.descriptions.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: array owned by the topology.
        unsafe { std::slice::from_raw_parts(args.descriptions, args.num_descriptions) }
            .iter()
            .map(|&d| DeviceDescription::read(&self.plugin, d))
            .collect()
    }

    /// Topology attributes.
    pub fn attributes(&self) -> Result<Vec<NamedValue>> {
        let mut args = ffi::PJRT_TopologyDescription_Attributes_Args {
            struct_size: ffi::PJRT_TopologyDescription_Attributes_Args_STRUCT_SIZE as usize,
            topology: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_TopologyDescription_Attributes, &mut args)?;
        // SAFETY: owned by the topology.
        Ok(unsafe { from_raw_list(args.attributes, args.num_attributes) })
    }

    /// Compiles for this topology without a client (`PJRT_Compile`). The
    /// result cannot run but reports memory stats and cost analysis.
    pub fn compile(&self, program: &Program, options: &CompileOptions) -> Result<Executable> {
        let opts = options.encode()?;
        let raw_program = program.raw();
        let mut args = ffi::PJRT_Compile_Args {
            struct_size: ffi::PJRT_Compile_Args_STRUCT_SIZE as usize,
            topology: self.raw,
            program: &raw_program,
            compile_options: opts.as_ptr().cast(),
            compile_options_size: opts.len(),
            client: std::ptr::null_mut(),
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Compile, &mut args)?;
        Ok(Executable::from_raw(
            &self.plugin,
            args.executable,
            self._client.clone(),
        ))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let mut args = ffi::PJRT_TopologyDescription_Destroy_Args {
            struct_size: ffi::PJRT_TopologyDescription_Destroy_Args_STRUCT_SIZE as usize,
            topology: self.raw,
            ..Default::default()
        };
        let _ = pjrt_call!(&self.plugin, PJRT_TopologyDescription_Destroy, &mut args);
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("platform", &self.platform_name().ok())
            .field("owned", &self.owned)
            .finish()
    }
}
