//! `PJRT_NamedValue`: key/value pairs used for client/topology create options,
//! plugin and device attributes, and cost analysis.

use std::marker::PhantomData;

use crate::ffi;

/// The value of a [`NamedValue`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `PJRT_NamedValue_kString`.
    String(String),
    /// `PJRT_NamedValue_kInt64`.
    Int64(i64),
    /// `PJRT_NamedValue_kInt64List`.
    Int64List(Vec<i64>),
    /// `PJRT_NamedValue_kFloat`.
    Float(f32),
    /// `PJRT_NamedValue_kBool`.
    Bool(bool),
}

impl Value {
    /// Numeric view (ints, floats and bools as `f64`); `None` for strings/lists.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int64(v) => Some(*v as f64),
            Value::Float(v) => Some(f64::from(*v)),
            Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            _ => None,
        }
    }
}

/// A named value (`PJRT_NamedValue`).
#[derive(Clone, Debug, PartialEq)]
pub struct NamedValue {
    /// The key.
    pub name: String,
    /// The value.
    pub value: Value,
}

impl NamedValue {
    /// Builds a named value.
    pub fn new(name: impl Into<String>, value: Value) -> Self {
        NamedValue {
            name: name.into(),
            value,
        }
    }

    /// An int64 named value.
    pub fn int64(name: impl Into<String>, v: i64) -> Self {
        Self::new(name, Value::Int64(v))
    }

    /// A string named value.
    pub fn string(name: impl Into<String>, v: impl Into<String>) -> Self {
        Self::new(name, Value::String(v.into()))
    }

    /// A bool named value.
    pub fn bool(name: impl Into<String>, v: bool) -> Self {
        Self::new(name, Value::Bool(v))
    }
}

/// Copies a (ptr, len) string out of the plugin (lossy UTF-8).
///
/// # Safety
/// `ptr` must be valid for `len` bytes or null.
pub(crate) unsafe fn string_from_raw(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies a plugin-owned array of named values.
///
/// # Safety
/// `ptr` must point to `n` valid `PJRT_NamedValue`s (or be null with n == 0).
pub(crate) unsafe fn from_raw_list(ptr: *const ffi::PJRT_NamedValue, n: usize) -> Vec<NamedValue> {
    if ptr.is_null() || n == 0 {
        return Vec::new();
    }
    let raw = unsafe { std::slice::from_raw_parts(ptr, n) };
    raw.iter()
        .map(|nv| {
            let name = unsafe { string_from_raw(nv.name, nv.name_size) };
            let u = &nv.__bindgen_anon_1;
            let value = unsafe {
                match nv.type_ {
                    ffi::PJRT_NamedValue_kString => {
                        Value::String(string_from_raw(u.string_value, nv.value_size))
                    }
                    ffi::PJRT_NamedValue_kInt64 => Value::Int64(u.int64_value),
                    ffi::PJRT_NamedValue_kInt64List => {
                        Value::Int64List(if u.int64_array_value.is_null() {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(u.int64_array_value, nv.value_size).to_vec()
                        })
                    }
                    ffi::PJRT_NamedValue_kFloat => Value::Float(u.float_value),
                    ffi::PJRT_NamedValue_kBool => Value::Bool(u.bool_value),
                    other => Value::String(format!("<unknown PJRT_NamedValue type {other}>")),
                }
            };
            NamedValue { name, value }
        })
        .collect()
}

/// FFI view of borrowed named values; valid while the borrowed slice lives.
pub(crate) struct RawNamedValues<'a> {
    raw: Vec<ffi::PJRT_NamedValue>,
    _borrow: PhantomData<&'a [NamedValue]>,
}

impl<'a> RawNamedValues<'a> {
    pub(crate) fn new(values: &'a [NamedValue]) -> Self {
        let raw = values
            .iter()
            .map(|nv| {
                let mut r = ffi::PJRT_NamedValue {
                    struct_size: ffi::PJRT_NamedValue_STRUCT_SIZE as usize,
                    name: nv.name.as_ptr().cast(),
                    name_size: nv.name.len(),
                    value_size: 1,
                    ..Default::default()
                };
                match &nv.value {
                    Value::String(s) => {
                        r.type_ = ffi::PJRT_NamedValue_kString;
                        r.__bindgen_anon_1.string_value = s.as_ptr().cast();
                        r.value_size = s.len();
                    }
                    Value::Int64(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kInt64;
                        r.__bindgen_anon_1.int64_value = *v;
                    }
                    Value::Int64List(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kInt64List;
                        r.__bindgen_anon_1.int64_array_value = v.as_ptr();
                        r.value_size = v.len();
                    }
                    Value::Float(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kFloat;
                        r.__bindgen_anon_1.float_value = *v;
                    }
                    Value::Bool(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kBool;
                        r.__bindgen_anon_1.bool_value = *v;
                    }
                }
                r
            })
            .collect();
        RawNamedValues {
            raw,
            _borrow: PhantomData,
        }
    }

    pub(crate) fn as_ptr(&self) -> *const ffi::PJRT_NamedValue {
        if self.raw.is_empty() {
            std::ptr::null()
        } else {
            self.raw.as_ptr()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }
}
