//! `PJRT_Buffer`: host->device transfers, device->host copies, shape queries.

use std::rc::Rc;

use crate::client::{Client, ClientInner};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi;
use crate::plugin::{pjrt_call, Plugin};
use crate::types::{ElementType, NativeType};

/// A device buffer; destroyed on drop. Keeps its client alive.
pub struct Buffer {
    pub(crate) client: Rc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
}

impl Client {
    /// Copies a typed host slice to `device` as an array of shape `dims`
    /// (dense, row-major).
    pub fn buffer_from_host<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        // SAFETY: `T` is a sealed plain type whose bytes are the element encoding
        // (`bool` is one byte, 0 or 1, as PRED).
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        self.buffer_from_bytes(T::TYPE, bytes, dims, device)
    }

    /// Copies raw host bytes (dense, row-major, little-endian) of element type
    /// `ty` to `device` as an array of shape `dims`. The length must match.
    pub fn buffer_from_bytes(
        &self,
        ty: ElementType,
        bytes: &[u8],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        if !device.same_client(&self.inner) {
            return Err(Error::InvalidArgument(
                "device belongs to another client".into(),
            ));
        }
        if dims.iter().any(|&d| d < 0) {
            return Err(Error::InvalidArgument(format!(
                "negative dimension in {dims:?}"
            )));
        }
        let elems: i64 = dims.iter().product();
        if let Some(size) = ty.byte_size() {
            if elems as usize * size != bytes.len() {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes given for {ty:?}{dims:?}, which needs {}",
                    bytes.len(),
                    elems as usize * size
                )));
            }
        }
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args {
            struct_size: ffi::PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE as usize,
            client: self.raw(),
            data: bytes.as_ptr().cast(),
            type_: ty.to_raw(),
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            // The runtime copies `data` before returning; nothing to keep alive.
            host_buffer_semantics: ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            device: device.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Client_BufferFromHostBuffer, &mut args)?;
        let buffer = Buffer {
            client: self.inner.clone(),
            raw: args.buffer,
        };
        if !args.done_with_host_buffer.is_null() {
            let done = Event::from_raw(&self.inner, args.done_with_host_buffer);
            done.wait()?;
        }
        Ok(buffer)
    }
}

impl Buffer {
    fn plugin(&self) -> &Plugin {
        &self.client.plugin
    }

    /// Element type (`PJRT_Buffer_ElementType`).
    pub fn element_type(&self) -> Result<ElementType> {
        let mut args = ffi::PJRT_Buffer_ElementType_Args {
            struct_size: ffi::PJRT_Buffer_ElementType_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_ElementType, &mut args)?;
        Ok(ElementType::from_raw(args.type_))
    }

    /// Dimensions (`PJRT_Buffer_Dimensions`).
    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = ffi::PJRT_Buffer_Dimensions_Args {
            struct_size: ffi::PJRT_Buffer_Dimensions_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_Dimensions, &mut args)?;
        if args.dims.is_null() || args.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: owned by the buffer, `num_dims` long.
        Ok(unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec())
    }

    /// Number of elements (product of dims).
    pub fn element_count(&self) -> Result<usize> {
        Ok(self.dims()?.iter().product::<i64>() as usize)
    }

    /// Size on device in bytes.
    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args {
            struct_size: ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_OnDeviceSizeInBytes, &mut args)?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Result<Device> {
        let mut args = ffi::PJRT_Buffer_Device_Args {
            struct_size: ffi::PJRT_Buffer_Device_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_Device, &mut args)?;
        Ok(Device::from_raw(&self.client, args.device))
    }

    /// An event that becomes ready when the buffer's data is (`PJRT_Buffer_ReadyEvent`).
    pub fn ready_event(&self) -> Result<Event> {
        let mut args = ffi::PJRT_Buffer_ReadyEvent_Args {
            struct_size: ffi::PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_ReadyEvent, &mut args)?;
        Ok(Event::from_raw(&self.client, args.event))
    }

    /// Blocks until the buffer is ready; returns the error that produced it, if any.
    pub fn block_until_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }

    /// Copies the buffer to host as dense row-major bytes, waiting for the copy.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut query = ffi::PJRT_Buffer_ToHostBuffer_Args {
            struct_size: ffi::PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE as usize,
            src: self.raw,
            ..Default::default()
        };
        // With `dst == null` the plugin only reports the size needed.
        pjrt_call!(self.plugin(), PJRT_Buffer_ToHostBuffer, &mut query)?;
        if !query.event.is_null() {
            drop(Event::from_raw(&self.client, query.event));
        }
        let mut out = vec![0u8; query.dst_size];
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args {
            struct_size: ffi::PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE as usize,
            src: self.raw,
            dst: out.as_mut_ptr().cast(),
            dst_size: out.len(),
            ..Default::default()
        };
        pjrt_call!(self.plugin(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        if !args.event.is_null() {
            // `out` must stay alive until the copy is done.
            Event::from_raw(&self.client, args.event).wait()?;
        }
        Ok(out)
    }

    /// Copies the buffer to host as `T`s; errors if `T` is not the buffer's type.
    pub fn to_host<T: NativeType>(&self) -> Result<Vec<T>> {
        let ty = self.element_type()?;
        if ty != T::TYPE {
            return Err(Error::InvalidArgument(format!(
                "buffer holds {ty:?}, requested {:?}",
                T::TYPE
            )));
        }
        let bytes = self.to_host_bytes()?;
        let expected = self.element_count()? * std::mem::size_of::<T>();
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "plugin returned {} bytes, expected {expected} for a dense {ty:?} array",
                bytes.len()
            )));
        }
        Ok(T::decode(&bytes))
    }

    /// The raw handle (for advanced FFI use; stays owned by `self`).
    pub fn as_raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args {
            struct_size: ffi::PJRT_Buffer_Destroy_Args_STRUCT_SIZE as usize,
            buffer: self.raw,
            ..Default::default()
        };
        let _ = pjrt_call!(&self.client.plugin, PJRT_Buffer_Destroy, &mut args);
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("element_type", &self.element_type().ok())
            .field("dims", &self.dims().ok())
            .finish()
    }
}
