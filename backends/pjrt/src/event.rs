//! `PJRT_Event`: completion of asynchronous work, with error propagation.

use std::rc::Rc;

use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::ffi;
use crate::plugin::pjrt_call;

/// An owned PJRT event; destroyed on drop.
pub struct Event {
    client: Rc<ClientInner>,
    raw: *mut ffi::PJRT_Event,
}

impl Event {
    pub(crate) fn from_raw(client: &Rc<ClientInner>, raw: *mut ffi::PJRT_Event) -> Self {
        Event {
            client: client.clone(),
            raw,
        }
    }

    /// Blocks until the event is ready; returns the error the work ended with.
    pub fn wait(&self) -> Result<()> {
        let mut args = ffi::PJRT_Event_Await_Args {
            struct_size: ffi::PJRT_Event_Await_Args_STRUCT_SIZE as usize,
            event: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.client.plugin, PJRT_Event_Await, &mut args)
    }

    /// Whether the event is ready (completed, possibly with an error).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Event_IsReady_Args {
            struct_size: ffi::PJRT_Event_IsReady_Args_STRUCT_SIZE as usize,
            event: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.client.plugin, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// The error of a ready event (`PJRT_Event_Error`); `Ok(())` if none.
    /// Errors with [`Error::InvalidArgument`] if the event is not ready yet.
    pub fn error(&self) -> Result<()> {
        if !self.is_ready()? {
            return Err(Error::InvalidArgument(
                "PJRT_Event_Error called on an event that is not ready".into(),
            ));
        }
        let mut args = ffi::PJRT_Event_Error_Args {
            struct_size: ffi::PJRT_Event_Error_Args_STRUCT_SIZE as usize,
            event: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.client.plugin, PJRT_Event_Error, &mut args)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Event_Destroy_Args {
            struct_size: ffi::PJRT_Event_Destroy_Args_STRUCT_SIZE as usize,
            event: self.raw,
            ..Default::default()
        };
        let _ = pjrt_call!(&self.client.plugin, PJRT_Event_Destroy, &mut args);
    }
}

/// Waits for every event, returning the first error (after waiting for all).
pub fn wait_all<'a>(events: impl IntoIterator<Item = &'a Event>) -> Result<()> {
    let mut first = Ok(());
    for e in events {
        let r = e.wait();
        if first.is_ok() {
            first = r;
        }
    }
    first
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("ready", &self.is_ready().ok())
            .finish()
    }
}
