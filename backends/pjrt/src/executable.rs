//! `PJRT_Executable` (compiled program: metadata, memory stats, cost
//! analysis) and `PJRT_LoadedExecutable` (loaded on a client: execute).

use std::rc::Rc;

use crate::buffer::Buffer;
use crate::client::ClientInner;
use crate::device::Device;
use crate::error::{optional, Error, Result};
use crate::event::{wait_all, Event};
use crate::ffi;
use crate::named::{from_raw_list, string_from_raw, NamedValue, Value};
use crate::plugin::{pjrt_call, Plugin};
use crate::types::ElementType;

/// A compiled (not necessarily loaded) executable; destroyed on drop.
pub struct Executable {
    plugin: Plugin,
    raw: *mut ffi::PJRT_Executable,
    /// Keeps the client alive when the executable came from a loaded one.
    _client: Option<Rc<ClientInner>>,
}

/// Compiled memory statistics (`PJRT_Executable_GetCompiledMemoryStats`), in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    /// Generated code size.
    pub generated_code_size_in_bytes: i64,
    /// Arguments size.
    pub argument_size_in_bytes: i64,
    /// Outputs size.
    pub output_size_in_bytes: i64,
    /// Size of outputs aliased with arguments.
    pub alias_size_in_bytes: i64,
    /// Temporary (scratch) size.
    pub temp_size_in_bytes: i64,
    /// Host-side generated code size.
    pub host_generated_code_size_in_bytes: i64,
    /// Host-side arguments size.
    pub host_argument_size_in_bytes: i64,
    /// Host-side outputs size.
    pub host_output_size_in_bytes: i64,
    /// Host-side aliased size.
    pub host_alias_size_in_bytes: i64,
    /// Host-side temporary size.
    pub host_temp_size_in_bytes: i64,
    /// Peak memory, when the header has the field (API >= the minor that added it).
    pub peak_memory_in_bytes: Option<i64>,
}

/// Cost-analysis properties (`PJRT_Executable_GetCostAnalysis`), e.g.
/// `flops`, `bytes accessed`, `transcendentals`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostAnalysis {
    /// The properties in plugin order.
    pub properties: Vec<NamedValue>,
}

impl CostAnalysis {
    /// The value of property `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.value)
    }

    /// Numeric value of property `name`.
    pub fn get_f64(&self, name: &str) -> Option<f64> {
        self.get(name).and_then(Value::as_f64)
    }
}

impl Executable {
    pub(crate) fn from_raw(
        plugin: &Plugin,
        raw: *mut ffi::PJRT_Executable,
        client: Option<Rc<ClientInner>>,
    ) -> Self {
        Executable {
            plugin: plugin.clone(),
            raw,
            _client: client,
        }
    }

    /// Executable name (`PJRT_Executable_Name`).
    pub fn name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Executable_Name_Args {
            struct_size: ffi::PJRT_Executable_Name_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_Name, &mut args)?;
        // SAFETY: owned by the executable.
        Ok(unsafe { string_from_raw(args.executable_name, args.executable_name_size) })
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Executable_NumOutputs_Args {
            struct_size: ffi::PJRT_Executable_NumOutputs_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_NumOutputs, &mut args)?;
        Ok(args.num_outputs)
    }

    /// Number of replicas compiled for.
    pub fn num_replicas(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Executable_NumReplicas_Args {
            struct_size: ffi::PJRT_Executable_NumReplicas_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_NumReplicas, &mut args)?;
        Ok(args.num_replicas)
    }

    /// Number of partitions compiled for.
    pub fn num_partitions(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Executable_NumPartitions_Args {
            struct_size: ffi::PJRT_Executable_NumPartitions_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_NumPartitions, &mut args)?;
        Ok(args.num_partitions)
    }

    /// Element types of the outputs.
    pub fn output_element_types(&self) -> Result<Vec<ElementType>> {
        let mut args = ffi::PJRT_Executable_OutputElementTypes_Args {
            struct_size: ffi::PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_OutputElementTypes, &mut args)?;
        if args.output_types.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: owned by the executable.
        Ok(
            unsafe { std::slice::from_raw_parts(args.output_types, args.num_output_types) }
                .iter()
                .map(|&t| ElementType::from_raw(t))
                .collect(),
        )
    }

    /// Dimensions of every output.
    pub fn output_dims(&self) -> Result<Vec<Vec<i64>>> {
        let mut args = ffi::PJRT_Executable_OutputDimensions_Args {
            struct_size: ffi::PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(&self.plugin, PJRT_Executable_OutputDimensions, &mut args)?;
        if args.dim_sizes.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `num_outputs` sizes and their concatenated dims, owned by the executable.
        let sizes = unsafe { std::slice::from_raw_parts(args.dim_sizes, args.num_outputs) };
        let total: usize = sizes.iter().sum();
        let dims = if total == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(args.dims, total) }
        };
        let mut out = Vec::with_capacity(sizes.len());
        let mut at = 0;
        for &n in sizes {
            out.push(dims[at..at + n].to_vec());
            at += n;
        }
        Ok(out)
    }

    /// Fingerprint of the executable; `Ok(None)` if unimplemented.
    pub fn fingerprint(&self) -> Result<Option<String>> {
        let mut args = ffi::PJRT_Executable_Fingerprint_Args {
            struct_size: ffi::PJRT_Executable_Fingerprint_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        optional(pjrt_call!(
            &self.plugin,
            PJRT_Executable_Fingerprint,
            &mut args
        ))
        // SAFETY: owned by the executable.
        .map(|o| {
            o.map(|()| unsafe {
                string_from_raw(
                    args.executable_fingerprint,
                    args.executable_fingerprint_size,
                )
            })
        })
    }

    /// Compiled memory statistics; `Ok(None)` if the plugin does not implement them.
    pub fn compiled_memory_stats(&self) -> Result<Option<CompiledMemoryStats>> {
        let mut a = ffi::PJRT_Executable_GetCompiledMemoryStats_Args {
            struct_size: ffi::PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        let r = optional(pjrt_call!(
            &self.plugin,
            PJRT_Executable_GetCompiledMemoryStats,
            &mut a
        ))?;
        #[cfg(pjrt_has_peak_memory)]
        let peak = Some(a.peak_memory_in_bytes);
        #[cfg(not(pjrt_has_peak_memory))]
        let peak = None;
        Ok(r.map(|()| CompiledMemoryStats {
            generated_code_size_in_bytes: a.generated_code_size_in_bytes,
            argument_size_in_bytes: a.argument_size_in_bytes,
            output_size_in_bytes: a.output_size_in_bytes,
            alias_size_in_bytes: a.alias_size_in_bytes,
            temp_size_in_bytes: a.temp_size_in_bytes,
            host_generated_code_size_in_bytes: a.host_generated_code_size_in_bytes,
            host_argument_size_in_bytes: a.host_argument_size_in_bytes,
            host_output_size_in_bytes: a.host_output_size_in_bytes,
            host_alias_size_in_bytes: a.host_alias_size_in_bytes,
            host_temp_size_in_bytes: a.host_temp_size_in_bytes,
            peak_memory_in_bytes: peak,
        }))
    }

    /// Cost analysis; `Ok(None)` if the plugin does not implement it.
    pub fn cost_analysis(&self) -> Result<Option<CostAnalysis>> {
        let mut args = ffi::PJRT_Executable_GetCostAnalysis_Args {
            struct_size: ffi::PJRT_Executable_GetCostAnalysis_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        let r = optional(pjrt_call!(
            &self.plugin,
            PJRT_Executable_GetCostAnalysis,
            &mut args
        ))?;
        // SAFETY: properties are owned by the executable.
        Ok(r.map(|()| CostAnalysis {
            properties: unsafe { from_raw_list(args.properties, args.num_properties) },
        }))
    }

    /// The optimized program (`PJRT_Executable_OptimizedProgram`): (format, bytes), e.g.
    /// ("hlo", a serialized `HloModuleProto`); `Ok(None)` if the plugin does not implement
    /// it.
    pub fn optimized_program(&self) -> Result<Option<(String, Vec<u8>)>> {
        const FORMAT: &[u8] = b"hlo";
        let mut program = ffi::PJRT_Program {
            struct_size: ffi::PJRT_Program_STRUCT_SIZE as usize,
            format: FORMAT.as_ptr().cast(),
            format_size: FORMAT.len(),
            ..Default::default()
        };
        let mut args = ffi::PJRT_Executable_OptimizedProgram_Args {
            struct_size: ffi::PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            program: &mut program,
            ..Default::default()
        };
        // First call: the size; second: the bytes into our buffer.
        if optional(pjrt_call!(
            &self.plugin,
            PJRT_Executable_OptimizedProgram,
            &mut args
        ))?
        .is_none()
        {
            return Ok(None);
        }
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        args.program = &mut program;
        pjrt_call!(&self.plugin, PJRT_Executable_OptimizedProgram, &mut args)?;
        // SAFETY: the plugin owns the format string and reports its length.
        let format = if program.format.is_null() {
            String::new()
        } else {
            let f = unsafe {
                std::slice::from_raw_parts(program.format.cast::<u8>(), program.format_size)
            };
            String::from_utf8_lossy(f).into_owned()
        };
        code.truncate(program.code_size);
        Ok(Some((format, code)))
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Executable_Destroy_Args {
            struct_size: ffi::PJRT_Executable_Destroy_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        let _ = pjrt_call!(&self.plugin, PJRT_Executable_Destroy, &mut args);
    }
}

/// An executable loaded on a client; destroyed on drop.
pub struct LoadedExecutable {
    client: Rc<ClientInner>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    executable: Executable,
    num_outputs: usize,
}

/// Outputs of an asynchronous execution plus one completion event per device.
pub struct Execution {
    /// `outputs[device][output]`.
    pub outputs: Vec<Vec<Buffer>>,
    /// Completion event of each device's execution.
    pub device_events: Vec<Event>,
}

impl Execution {
    /// Waits for every device to finish, then returns the outputs (the first
    /// execution error, if any, after waiting for all devices).
    pub fn wait(self) -> Result<Vec<Vec<Buffer>>> {
        wait_all(&self.device_events)?;
        Ok(self.outputs)
    }
}

impl LoadedExecutable {
    pub(crate) fn from_raw(
        client: &Rc<ClientInner>,
        raw: *mut ffi::PJRT_LoadedExecutable,
    ) -> Result<Self> {
        let plugin = &client.plugin;
        let mut args = ffi::PJRT_LoadedExecutable_GetExecutable_Args {
            struct_size: ffi::PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE as usize,
            loaded_executable: raw,
            ..Default::default()
        };
        if let Err(e) = pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut args) {
            destroy_loaded(plugin, raw);
            return Err(e);
        }
        let executable = Executable::from_raw(plugin, args.executable, Some(client.clone()));
        let num_outputs = match executable.num_outputs() {
            Ok(n) => n,
            Err(e) => {
                drop(executable);
                destroy_loaded(plugin, raw);
                return Err(e);
            }
        };
        Ok(LoadedExecutable {
            client: client.clone(),
            raw,
            executable,
            num_outputs,
        })
    }

    /// The compiled executable (metadata, memory stats, cost analysis).
    pub fn executable(&self) -> &Executable {
        &self.executable
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Devices the executable runs on, in the order `execute` expects
    /// argument lists.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_LoadedExecutable_AddressableDevices_Args {
            struct_size: ffi::PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            ..Default::default()
        };
        pjrt_call!(
            &self.client.plugin,
            PJRT_LoadedExecutable_AddressableDevices,
            &mut args
        )?;
        if args.addressable_devices.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: array owned by the executable.
        Ok(unsafe {
            std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
        }
        .iter()
        .map(|&d| Device::from_raw(&self.client, d))
        .collect())
    }

    /// Executes with one argument list per addressable device and waits for
    /// completion; returns `outputs[device][output]`.
    pub fn execute<'a, L: AsRef<[&'a Buffer]>>(
        &self,
        argument_lists: &[L],
    ) -> Result<Vec<Vec<Buffer>>> {
        self.execute_async(argument_lists)?.wait()
    }

    /// Launches with one argument list per addressable device and returns
    /// without waiting; use [`Execution::wait`] (or the buffers' ready
    /// events) to wait for the outputs.
    pub fn execute_async<'a, L: AsRef<[&'a Buffer]>>(
        &self,
        argument_lists: &[L],
    ) -> Result<Execution> {
        let num_devices = argument_lists.len();
        if num_devices == 0 {
            return Err(Error::InvalidArgument(
                "execute needs one argument list per device (got none)".into(),
            ));
        }
        let num_args = argument_lists[0].as_ref().len();
        for (i, l) in argument_lists.iter().enumerate() {
            let l = l.as_ref();
            if l.len() != num_args {
                return Err(Error::InvalidArgument(format!(
                    "argument list {i} has {} buffers, list 0 has {num_args}",
                    l.len()
                )));
            }
            if l.iter().any(|b| !Rc::ptr_eq(&b.client, &self.client)) {
                return Err(Error::InvalidArgument(format!(
                    "argument list {i} has a buffer of another client"
                )));
            }
        }
        // Row-major [device][arg] and [device][output] pointer tables; the
        // outer arrays point at the inner ones, which must not move until the
        // call returns.
        let arg_rows: Vec<Vec<*mut ffi::PJRT_Buffer>> = argument_lists
            .iter()
            .map(|l| l.as_ref().iter().map(|b| b.raw).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut ffi::PJRT_Buffer> =
            arg_rows.iter().map(|r| r.as_ptr()).collect();
        let mut out_rows: Vec<Vec<*mut ffi::PJRT_Buffer>> = (0..num_devices)
            .map(|_| vec![std::ptr::null_mut(); self.num_outputs])
            .collect();
        let out_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> =
            out_rows.iter_mut().map(|r| r.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); num_devices];

        let mut options = ffi::PJRT_ExecuteOptions {
            struct_size: ffi::PJRT_ExecuteOptions_STRUCT_SIZE as usize,
            ..Default::default()
        };
        let mut args = ffi::PJRT_LoadedExecutable_Execute_Args {
            struct_size: ffi::PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE as usize,
            executable: self.raw,
            options: &mut options,
            argument_lists: arg_ptrs.as_ptr(),
            num_devices,
            num_args,
            output_lists: out_ptrs.as_ptr(),
            device_complete_events: events.as_mut_ptr(),
            ..Default::default()
        };
        pjrt_call!(
            &self.client.plugin,
            PJRT_LoadedExecutable_Execute,
            &mut args
        )?;
        drop(out_ptrs);
        let outputs = out_rows
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .filter(|p| !p.is_null())
                    .map(|raw| Buffer {
                        client: self.client.clone(),
                        raw,
                    })
                    .collect()
            })
            .collect();
        let device_events = events
            .into_iter()
            .filter(|e| !e.is_null())
            .map(|e| Event::from_raw(&self.client, e))
            .collect();
        Ok(Execution {
            outputs,
            device_events,
        })
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        destroy_loaded(&self.client.plugin, self.raw);
    }
}

fn destroy_loaded(plugin: &Plugin, raw: *mut ffi::PJRT_LoadedExecutable) {
    let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args {
        struct_size: ffi::PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE as usize,
        executable: raw,
        ..Default::default()
    };
    let _ = pjrt_call!(plugin, PJRT_LoadedExecutable_Destroy, &mut args);
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("name", &self.name().ok())
            .finish()
    }
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("name", &self.executable.name().ok())
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("outputs", &self.outputs)
            .field("device_events", &self.device_events.len())
            .finish()
    }
}
