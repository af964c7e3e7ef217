//! `PJRT_Client`: creation with options, platform queries, devices, compile.

use std::rc::Rc;

use crate::compile::{CompileOptions, DeviceAssignment, Program};
use crate::device::Device;
use crate::error::Result;
use crate::executable::LoadedExecutable;
use crate::ffi;
use crate::named::{string_from_raw, NamedValue, RawNamedValues};
use crate::plugin::{pjrt_call, Plugin};
use crate::topology::Topology;

/// Shared owner of the raw client; every object made from a client holds one,
/// so the client is destroyed only after the last buffer/executable/event.
pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args {
            struct_size: ffi::PJRT_Client_Destroy_Args_STRUCT_SIZE as usize,
            client: self.raw,
            ..Default::default()
        };
        let _ = pjrt_call!(&self.plugin, PJRT_Client_Destroy, &mut args);
    }
}

/// Options for `PJRT_Client_Create`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientOptions {
    /// CPU plugin: number of CPU devices (`cpu_device_count`, int64). The CPU
    /// plugin defaults to 4; `XLA_FLAGS` does not change it.
    pub cpu_device_count: Option<i64>,
    /// Further plugin-specific create options.
    pub named_values: Vec<NamedValue>,
}

impl ClientOptions {
    /// Options with `cpu_device_count` set.
    pub fn cpu_devices(n: i64) -> Self {
        ClientOptions {
            cpu_device_count: Some(n),
            ..Default::default()
        }
    }

    /// All options as named values.
    pub fn to_named_values(&self) -> Vec<NamedValue> {
        let mut v = Vec::with_capacity(self.named_values.len() + 1);
        if let Some(n) = self.cpu_device_count {
            v.push(NamedValue::int64("cpu_device_count", n));
        }
        v.extend(self.named_values.iter().cloned());
        v
    }
}

/// A PJRT client. Not `Send`: create one client per thread.
pub struct Client {
    pub(crate) inner: Rc<ClientInner>,
}

impl Client {
    /// Creates a client (`PJRT_Client_Create`) without key-value store callbacks.
    pub fn new(plugin: &Plugin, options: &ClientOptions) -> Result<Client> {
        let named = options.to_named_values();
        let raw_named = RawNamedValues::new(&named);
        let mut args = ffi::PJRT_Client_Create_Args {
            struct_size: ffi::PJRT_Client_Create_Args_STRUCT_SIZE as usize,
            create_options: raw_named.as_ptr(),
            num_options: raw_named.len(),
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_Client_Create, &mut args)?;
        Ok(Client {
            inner: Rc::new(ClientInner {
                plugin: plugin.clone(),
                raw: args.client,
            }),
        })
    }

    /// The plugin this client was created from.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Client {
        self.inner.raw
    }

    /// Platform name, e.g. `"cpu"`.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args {
            struct_size: ffi::PJRT_Client_PlatformName_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: owned by the client, valid for this call.
        Ok(unsafe { string_from_raw(args.platform_name, args.platform_name_size) })
    }

    /// Platform version string (plugin-specific).
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args {
            struct_size: ffi::PJRT_Client_PlatformVersion_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_PlatformVersion, &mut args)?;
        // SAFETY: owned by the client.
        Ok(unsafe { string_from_raw(args.platform_version, args.platform_version_size) })
    }

    /// Process index of this client (0 in single-process setups).
    pub fn process_index(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Client_ProcessIndex_Args {
            struct_size: ffi::PJRT_Client_ProcessIndex_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_ProcessIndex, &mut args)?;
        Ok(args.process_index)
    }

    /// All devices visible to the client.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_Devices_Args {
            struct_size: ffi::PJRT_Client_Devices_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_Devices, &mut args)?;
        // SAFETY: array owned by the client.
        Ok(unsafe { self.wrap_devices(args.devices, args.num_devices) })
    }

    /// Devices this client can issue work to.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_AddressableDevices_Args {
            struct_size: ffi::PJRT_Client_AddressableDevices_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_AddressableDevices, &mut args)?;
        // SAFETY: array owned by the client.
        Ok(unsafe { self.wrap_devices(args.addressable_devices, args.num_addressable_devices) })
    }

    /// The device with global id `id` (`PJRT_Client_LookupDevice`).
    pub fn lookup_device(&self, id: i32) -> Result<Device> {
        let mut args = ffi::PJRT_Client_LookupDevice_Args {
            struct_size: ffi::PJRT_Client_LookupDevice_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            id,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_LookupDevice, &mut args)?;
        Ok(Device::from_raw(&self.inner, args.device))
    }

    /// The client's default assignment for `replicas x partitions`.
    pub fn default_device_assignment(
        &self,
        replicas: usize,
        partitions: usize,
    ) -> Result<DeviceAssignment> {
        let mut ids = vec![0i32; replicas * partitions];
        let mut args = ffi::PJRT_Client_DefaultDeviceAssignment_Args {
            struct_size: ffi::PJRT_Client_DefaultDeviceAssignment_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            num_replicas: replicas as i32,
            num_partitions: partitions as i32,
            default_assignment_size: ids.len(),
            default_assignment: ids.as_mut_ptr(),
            ..Default::default()
        };
        pjrt_call!(
            self.plugin(),
            PJRT_Client_DefaultDeviceAssignment,
            &mut args
        )?;
        // Written replica-major: ids[replica * partitions + partition].
        DeviceAssignment::new(
            (0..replicas)
                .map(|r| {
                    (0..partitions)
                        .map(|p| i64::from(ids[r * partitions + p]))
                        .collect()
                })
                .collect(),
        )
    }

    /// Compiles and loads a program (`PJRT_Client_Compile`).
    pub fn compile(&self, program: &Program, options: &CompileOptions) -> Result<LoadedExecutable> {
        let opts = options.encode()?;
        let raw_program = program.raw();
        let mut args = ffi::PJRT_Client_Compile_Args {
            struct_size: ffi::PJRT_Client_Compile_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            program: &raw_program,
            compile_options: opts.as_ptr().cast(),
            compile_options_size: opts.len(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_Compile, &mut args)?;
        LoadedExecutable::from_raw(&self.inner, args.executable)
    }

    /// The client's runtime topology (owned by the client).
    pub fn topology(&self) -> Result<Topology> {
        let mut args = ffi::PJRT_Client_TopologyDescription_Args {
            struct_size: ffi::PJRT_Client_TopologyDescription_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_TopologyDescription, &mut args)?;
        Ok(Topology::borrowed_from_client(&self.inner, args.topology))
    }

    /// # Safety
    /// `ptr` must point to `n` device pointers owned by this client.
    unsafe fn wrap_devices(&self, ptr: *const *mut ffi::PJRT_Device, n: usize) -> Vec<Device> {
        if ptr.is_null() || n == 0 {
            return Vec::new();
        }
        unsafe { std::slice::from_raw_parts(ptr, n) }
            .iter()
            .map(|&d| Device::from_raw(&self.inner, d))
            .collect()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin)
            .finish()
    }
}
