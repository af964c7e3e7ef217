//! Hand-written subsets of XLA's protobuf messages (prost derive, no protoc),
//! enough to serialize `CompileOptionsProto` for `PJRT_Client_Compile` and
//! `PJRT_Compile`. Only the fields we use are declared; protobuf readers
//! ignore absent fields, so the subsets stay wire-compatible.
//!
//! Field numbers are XLA's, from `xla/pjrt/proto/compile_options.proto`
//! (`CompileOptionsProto`, `ExecutableBuildOptionsProto`,
//! `OptionOverrideProto`) and `xla/xla_data.proto` (`DeviceAssignmentProto`).

use std::collections::HashMap;

/// `xla.CompileOptionsProto` (compile_options.proto), subset.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompileOptionsProto {
    /// `bool parameter_is_tupled_arguments = 2;`
    #[prost(bool, tag = "2")]
    pub parameter_is_tupled_arguments: bool,
    /// `ExecutableBuildOptionsProto executable_build_options = 3;`
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
    /// `bool compile_portable_executable = 4;`
    #[prost(bool, tag = "4")]
    pub compile_portable_executable: bool,
    /// `int64 profile_version = 5;`
    #[prost(int64, tag = "5")]
    pub profile_version: i64,
    /// `map<string, OptionOverrideProto> env_option_overrides = 7;` (XLA
    /// debug-option overrides by flag name, e.g. `xla_cpu_enable_fast_math`).
    #[prost(map = "string, message", tag = "7")]
    pub env_option_overrides: HashMap<String, OptionOverrideProto>,
}

/// `xla.ExecutableBuildOptionsProto` (compile_options.proto), subset.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecutableBuildOptionsProto {
    /// `int64 device_ordinal = 1;` (-1 means unset).
    #[prost(int64, tag = "1")]
    pub device_ordinal: i64,
    /// `int64 num_replicas = 4;`
    #[prost(int64, tag = "4")]
    pub num_replicas: i64,
    /// `int64 num_partitions = 5;`
    #[prost(int64, tag = "5")]
    pub num_partitions: i64,
    /// `bool use_spmd_partitioning = 6;`
    #[prost(bool, tag = "6")]
    pub use_spmd_partitioning: bool,
    /// `bool use_auto_spmd_partitioning = 7;`
    #[prost(bool, tag = "7")]
    pub use_auto_spmd_partitioning: bool,
    /// `xla.DeviceAssignmentProto device_assignment = 9;`
    #[prost(message, optional, tag = "9")]
    pub device_assignment: Option<DeviceAssignmentProto>,
    /// `bool use_shardy_partitioner = 19;`
    #[prost(bool, tag = "19")]
    pub use_shardy_partitioner: bool,
}

/// `xla.OptionOverrideProto` (compile_options.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionOverrideProto {
    /// `oneof value { string string_field = 1; bool bool_field = 2; int64 int_field = 3; double double_field = 4; }`
    #[prost(oneof = "OptionOverrideValue", tags = "1, 2, 3, 4")]
    pub value: Option<OptionOverrideValue>,
}

/// The `value` oneof of [`OptionOverrideProto`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum OptionOverrideValue {
    /// `string string_field = 1;`
    #[prost(string, tag = "1")]
    StringField(String),
    /// `bool bool_field = 2;`
    #[prost(bool, tag = "2")]
    BoolField(bool),
    /// `int64 int_field = 3;`
    #[prost(int64, tag = "3")]
    IntField(i64),
    /// `double double_field = 4;`
    #[prost(double, tag = "4")]
    DoubleField(f64),
}

/// `xla.DeviceAssignmentProto` (xla_data.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceAssignmentProto {
    /// `int32 replica_count = 1;`
    #[prost(int32, tag = "1")]
    pub replica_count: i32,
    /// `int32 computation_count = 2;`
    #[prost(int32, tag = "2")]
    pub computation_count: i32,
    /// `repeated ComputationDevice computation_devices = 3;` (one per
    /// computation/partition).
    #[prost(message, repeated, tag = "3")]
    pub computation_devices: Vec<ComputationDevice>,
}

/// `xla.DeviceAssignmentProto.ComputationDevice` (xla_data.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ComputationDevice {
    /// `repeated int64 replica_device_ids = 1;` (one per replica).
    #[prost(int64, repeated, tag = "1")]
    pub replica_device_ids: Vec<i64>,
}
