//! `PJRT_Device` and `PJRT_DeviceDescription`.

use std::rc::Rc;

use crate::client::ClientInner;
use crate::error::{optional, Result};
use crate::ffi;
use crate::named::{from_raw_list, string_from_raw, NamedValue};
use crate::plugin::{pjrt_call, Plugin};

/// A device owned by a client (keeps the client alive).
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Rc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Device,
}

/// A device description read out of the plugin (`PJRT_DeviceDescription_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceDescription {
    /// Global device id (`PJRT_DeviceDescription_Id`).
    pub id: i32,
    /// Process index owning the device.
    pub process_index: i32,
    /// Device kind, e.g. `"cpu"` or `"TPU v5 lite"`.
    pub kind: String,
    /// Verbose debug string.
    pub debug_string: String,
    /// Short description (`PJRT_DeviceDescription_ToString`).
    pub to_string: String,
    /// Platform-specific attributes.
    pub attributes: Vec<NamedValue>,
}

impl DeviceDescription {
    /// Reads all fields of a raw description.
    pub(crate) fn read(plugin: &Plugin, raw: *mut ffi::PJRT_DeviceDescription) -> Result<Self> {
        let mut id = ffi::PJRT_DeviceDescription_Id_Args {
            struct_size: ffi::PJRT_DeviceDescription_Id_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_Id, &mut id)?;
        let mut pi = ffi::PJRT_DeviceDescription_ProcessIndex_Args {
            struct_size: ffi::PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_ProcessIndex, &mut pi)?;
        let mut kind = ffi::PJRT_DeviceDescription_Kind_Args {
            struct_size: ffi::PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_Kind, &mut kind)?;
        let mut dbg = ffi::PJRT_DeviceDescription_DebugString_Args {
            struct_size: ffi::PJRT_DeviceDescription_DebugString_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_DebugString, &mut dbg)?;
        let mut ts = ffi::PJRT_DeviceDescription_ToString_Args {
            struct_size: ffi::PJRT_DeviceDescription_ToString_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_ToString, &mut ts)?;
        let mut at = ffi::PJRT_DeviceDescription_Attributes_Args {
            struct_size: ffi::PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE as usize,
            device_description: raw,
            ..Default::default()
        };
        pjrt_call!(plugin, PJRT_DeviceDescription_Attributes, &mut at)?;
        // SAFETY: strings and attributes are owned by the description.
        unsafe {
            Ok(DeviceDescription {
                id: id.id,
                process_index: pi.process_index,
                kind: string_from_raw(kind.device_kind, kind.device_kind_size),
                debug_string: string_from_raw(dbg.debug_string, dbg.debug_string_size),
                to_string: string_from_raw(ts.to_string, ts.to_string_size),
                attributes: from_raw_list(at.attributes, at.num_attributes),
            })
        }
    }
}

/// Allocator statistics of a device (`PJRT_Device_MemoryStats`); optional
/// fields are `None` when the plugin does not report them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemoryStats {
    /// Bytes currently in use.
    pub bytes_in_use: i64,
    /// Peak bytes in use.
    pub peak_bytes_in_use: Option<i64>,
    /// Number of allocations.
    pub num_allocs: Option<i64>,
    /// Largest single allocation.
    pub largest_alloc_size: Option<i64>,
    /// Memory limit.
    pub bytes_limit: Option<i64>,
    /// Bytes reserved.
    pub bytes_reserved: Option<i64>,
    /// Peak bytes reserved.
    pub peak_bytes_reserved: Option<i64>,
    /// Reservable limit.
    pub bytes_reservable_limit: Option<i64>,
    /// Largest free block.
    pub largest_free_block_bytes: Option<i64>,
    /// Pool bytes.
    pub pool_bytes: Option<i64>,
    /// Peak pool bytes.
    pub peak_pool_bytes: Option<i64>,
}

impl Device {
    pub(crate) fn from_raw(client: &Rc<ClientInner>, raw: *mut ffi::PJRT_Device) -> Self {
        Device {
            client: client.clone(),
            raw,
        }
    }

    fn plugin(&self) -> &Plugin {
        &self.client.plugin
    }

    /// The device's description (id, kind, debug string, ...).
    pub fn description(&self) -> Result<DeviceDescription> {
        let mut args = ffi::PJRT_Device_GetDescription_Args {
            struct_size: ffi::PJRT_Device_GetDescription_Args_STRUCT_SIZE as usize,
            device: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Device_GetDescription, &mut args)?;
        DeviceDescription::read(self.plugin(), args.device_description)
    }

    /// Global device id.
    pub fn id(&self) -> Result<i32> {
        Ok(self.description()?.id)
    }

    /// Device kind.
    pub fn kind(&self) -> Result<String> {
        Ok(self.description()?.kind)
    }

    /// Debug string.
    pub fn debug_string(&self) -> Result<String> {
        Ok(self.description()?.debug_string)
    }

    /// Whether this client can issue work to the device.
    pub fn is_addressable(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Device_IsAddressable_Args {
            struct_size: ffi::PJRT_Device_IsAddressable_Args_STRUCT_SIZE as usize,
            device: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Device_IsAddressable, &mut args)?;
        Ok(args.is_addressable)
    }

    /// Local hardware id (-1 if undefined).
    pub fn local_hardware_id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Device_LocalHardwareId_Args {
            struct_size: ffi::PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE as usize,
            device: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Device_LocalHardwareId, &mut args)?;
        Ok(args.local_hardware_id)
    }

    /// Allocator statistics; `Ok(None)` when the plugin does not implement
    /// them (the CPU plugin does not).
    pub fn memory_stats(&self) -> Result<Option<DeviceMemoryStats>> {
        optional(self.memory_stats_inner())
    }

    fn memory_stats_inner(&self) -> Result<DeviceMemoryStats> {
        let mut a = ffi::PJRT_Device_MemoryStats_Args {
            struct_size: ffi::PJRT_Device_MemoryStats_Args_STRUCT_SIZE as usize,
            device: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Device_MemoryStats, &mut a)?;
        let opt = |v: i64, set: bool| set.then_some(v);
        Ok(DeviceMemoryStats {
            bytes_in_use: a.bytes_in_use,
            peak_bytes_in_use: opt(a.peak_bytes_in_use, a.peak_bytes_in_use_is_set),
            num_allocs: opt(a.num_allocs, a.num_allocs_is_set),
            largest_alloc_size: opt(a.largest_alloc_size, a.largest_alloc_size_is_set),
            bytes_limit: opt(a.bytes_limit, a.bytes_limit_is_set),
            bytes_reserved: opt(a.bytes_reserved, a.bytes_reserved_is_set),
            peak_bytes_reserved: opt(a.peak_bytes_reserved, a.peak_bytes_reserved_is_set),
            bytes_reservable_limit: opt(a.bytes_reservable_limit, a.bytes_reservable_limit_is_set),
            largest_free_block_bytes: opt(
                a.largest_free_block_bytes,
                a.largest_free_block_bytes_is_set,
            ),
            pool_bytes: opt(a.pool_bytes, a.pool_bytes_is_set),
            peak_pool_bytes: opt(a.peak_pool_bytes, a.peak_pool_bytes_is_set),
        })
    }

    pub(crate) fn same_client(&self, client: &Rc<ClientInner>) -> bool {
        Rc::ptr_eq(&self.client, client)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.description() {
            Ok(d) => write!(f, "Device({})", d.to_string),
            Err(_) => write!(f, "Device({:p})", self.raw),
        }
    }
}
