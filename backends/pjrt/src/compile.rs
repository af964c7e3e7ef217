//! What to compile ([`Program`]) and how ([`CompileOptions`], serialized as
//! XLA's `CompileOptionsProto`).

use prost::Message;

use crate::error::{Error, Result};
use crate::ffi;
use crate::proto;

/// A program for `PJRT_Client_Compile` / `PJRT_Compile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    code: Vec<u8>,
    format: &'static str,
}

impl Program {
    /// StableHLO/MHLO as MLIR text (format `"mlir"`).
    pub fn mlir_text(text: &str) -> Self {
        Program {
            code: text.as_bytes().to_vec(),
            format: "mlir",
        }
    }

    /// StableHLO as MLIR bytecode, e.g. jax's `exported.mlir_module_serialized`
    /// (format `"mlir"`).
    pub fn mlir_bytecode(bytes: impl Into<Vec<u8>>) -> Self {
        Program {
            code: bytes.into(),
            format: "mlir",
        }
    }

    /// A serialized `HloModuleProto` (format `"hlo"`).
    pub fn hlo_module_proto(bytes: impl Into<Vec<u8>>) -> Self {
        Program {
            code: bytes.into(),
            format: "hlo",
        }
    }

    /// The PJRT format string.
    pub fn format(&self) -> &str {
        self.format
    }

    /// The code bytes.
    pub fn code(&self) -> &[u8] {
        &self.code
    }

    /// FFI view; valid while `self` lives.
    pub(crate) fn raw(&self) -> ffi::PJRT_Program {
        ffi::PJRT_Program {
            struct_size: ffi::PJRT_Program_STRUCT_SIZE as usize,
            // The plugin does not write through `code` when compiling.
            code: self.code.as_ptr() as *mut std::os::raw::c_char,
            code_size: self.code.len(),
            format: self.format.as_ptr().cast(),
            format_size: self.format.len(),
            ..Default::default()
        }
    }
}

/// A static device assignment: `devices[replica][partition]` = device id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAssignment {
    devices: Vec<Vec<i64>>,
}

impl DeviceAssignment {
    /// Builds an assignment from `devices[replica][partition]` device ids; all
    /// rows must have the same, non-zero length.
    pub fn new(devices: Vec<Vec<i64>>) -> Result<Self> {
        let partitions = devices.first().map_or(0, Vec::len);
        if devices.is_empty() || partitions == 0 || devices.iter().any(|r| r.len() != partitions) {
            return Err(Error::InvalidArgument(
                "device assignment must be a non-empty [replica][partition] matrix".into(),
            ));
        }
        Ok(DeviceAssignment { devices })
    }

    /// One replica per listed device, one partition.
    pub fn replicas(device_ids: &[i64]) -> Result<Self> {
        Self::new(device_ids.iter().map(|&d| vec![d]).collect())
    }

    /// Number of replicas (rows).
    pub fn num_replicas(&self) -> usize {
        self.devices.len()
    }

    /// Number of partitions (columns).
    pub fn num_partitions(&self) -> usize {
        self.devices[0].len()
    }

    /// The XLA proto: one `ComputationDevice` per partition listing the
    /// device of every replica.
    pub fn to_proto(&self) -> proto::DeviceAssignmentProto {
        let (r, p) = (self.num_replicas(), self.num_partitions());
        proto::DeviceAssignmentProto {
            replica_count: r as i32,
            computation_count: p as i32,
            computation_devices: (0..p)
                .map(|c| proto::ComputationDevice {
                    replica_device_ids: (0..r).map(|rep| self.devices[rep][c]).collect(),
                })
                .collect(),
        }
    }
}

/// Compile options; serialized to `CompileOptionsProto` by [`CompileOptions::encode`].
#[derive(Clone, Debug, PartialEq)]
pub struct CompileOptions {
    /// Number of replicas (default 1).
    pub num_replicas: i64,
    /// Number of partitions (default 1).
    pub num_partitions: i64,
    /// Static device assignment; `None` lets the client pick its default.
    pub device_assignment: Option<DeviceAssignment>,
    /// SPMD (true) vs MPMD partitioning when `num_partitions > 1`.
    pub use_spmd_partitioning: bool,
    /// Use the Shardy partitioner (jax's default for programs with `sdy` ops).
    pub use_shardy_partitioner: bool,
    /// Device ordinal to build for; -1 (default) means unset.
    pub device_ordinal: i64,
    /// Compile an executable that is not bound to a device assignment.
    pub compile_portable_executable: bool,
    /// XLA debug-option overrides by flag name (`env_option_overrides`).
    pub option_overrides: Vec<(String, proto::OptionOverrideValue)>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            device_assignment: None,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_ordinal: -1,
            compile_portable_executable: false,
            option_overrides: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// Options for `n` replicas (one partition), default device assignment.
    pub fn replicated(n: i64) -> Self {
        CompileOptions {
            num_replicas: n,
            ..Default::default()
        }
    }

    /// The proto message.
    pub fn to_proto(&self) -> proto::CompileOptionsProto {
        proto::CompileOptionsProto {
            executable_build_options: Some(proto::ExecutableBuildOptionsProto {
                device_ordinal: self.device_ordinal,
                num_replicas: self.num_replicas,
                num_partitions: self.num_partitions,
                use_spmd_partitioning: self.use_spmd_partitioning,
                use_auto_spmd_partitioning: false,
                device_assignment: self
                    .device_assignment
                    .as_ref()
                    .map(DeviceAssignment::to_proto),
                use_shardy_partitioner: self.use_shardy_partitioner,
            }),
            compile_portable_executable: self.compile_portable_executable,
            env_option_overrides: self
                .option_overrides
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        proto::OptionOverrideProto {
                            value: Some(v.clone()),
                        },
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Serialized `CompileOptionsProto` bytes, after checking that a device
    /// assignment (if any) matches the replica/partition counts.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.num_replicas < 1 || self.num_partitions < 1 {
            return Err(Error::InvalidArgument(
                "num_replicas and num_partitions must be >= 1".into(),
            ));
        }
        if let Some(da) = &self.device_assignment {
            if da.num_replicas() as i64 != self.num_replicas
                || da.num_partitions() as i64 != self.num_partitions
            {
                return Err(Error::InvalidArgument(format!(
                    "device assignment is {}x{} but options say {} replicas x {} partitions",
                    da.num_replicas(),
                    da.num_partitions(),
                    self.num_replicas,
                    self.num_partitions
                )));
            }
        }
        Ok(self.to_proto().encode_to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_options_encode_to_expected_wire_bytes() {
        let bytes = CompileOptions::replicated(2).encode().unwrap();
        // ExecutableBuildOptionsProto: device_ordinal(1) = -1 as a 10-byte
        // varint, num_replicas(4) = 2, num_partitions(5) = 1; wrapped in
        // CompileOptionsProto.executable_build_options(3).
        let mut inner = vec![0x08];
        inner.extend([0xff; 9]);
        inner.push(0x01);
        inner.extend([0x20, 0x02, 0x28, 0x01]);
        let mut expected = vec![0x1a, inner.len() as u8];
        expected.extend(inner);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn device_assignment_is_partition_major_in_proto() {
        let da = DeviceAssignment::new(vec![vec![0, 1], vec![2, 3], vec![4, 5]]).unwrap();
        let p = da.to_proto();
        assert_eq!((p.replica_count, p.computation_count), (3, 2));
        assert_eq!(p.computation_devices[0].replica_device_ids, vec![0, 2, 4]);
        assert_eq!(p.computation_devices[1].replica_device_ids, vec![1, 3, 5]);
        // Wire: replica_count(1)=3, computation_count(2)=2, then field 3
        // messages with packed field 1.
        let bytes = p.encode_to_vec();
        assert_eq!(&bytes[..4], &[0x08, 0x03, 0x10, 0x02]);
        assert_eq!(&bytes[4..9], &[0x1a, 0x05, 0x0a, 0x03, 0x00]);
        let back = proto::DeviceAssignmentProto::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn options_round_trip_and_validate() {
        let opts = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(DeviceAssignment::replicas(&[1, 0]).unwrap()),
            use_spmd_partitioning: true,
            option_overrides: vec![(
                "xla_cpu_enable_fast_math".into(),
                proto::OptionOverrideValue::BoolField(false),
            )],
            ..Default::default()
        };
        let bytes = opts.encode().unwrap();
        let back = proto::CompileOptionsProto::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, opts.to_proto());
        let ebo = back.executable_build_options.unwrap();
        assert_eq!(
            (ebo.num_replicas, ebo.num_partitions, ebo.device_ordinal),
            (2, 1, -1)
        );
        assert!(ebo.use_spmd_partitioning);
        assert_eq!(
            ebo.device_assignment.unwrap().computation_devices[0].replica_device_ids,
            vec![1, 0]
        );

        let bad = CompileOptions {
            num_replicas: 3,
            ..opts
        };
        assert!(matches!(bad.encode(), Err(Error::InvalidArgument(_))));
        assert!(DeviceAssignment::new(vec![vec![0], vec![]]).is_err());
        assert!(CompileOptions {
            num_partitions: 0,
            ..Default::default()
        }
        .encode()
        .is_err());
    }

    #[test]
    fn program_formats() {
        assert_eq!(Program::mlir_text("module {}").format(), "mlir");
        assert_eq!(Program::mlir_bytecode(vec![1, 2]).format(), "mlir");
        assert_eq!(Program::hlo_module_proto(vec![]).format(), "hlo");
    }
}
