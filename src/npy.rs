//! Minimal .npy (format 1.0) writer and reader for the suite's own files.
//!
//! Floats are written as little-endian f32 (`<f4`) whatever the case dtype: bf16 and f16
//! values are exactly representable, and `case.json` names the dtype to cast back to.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::Path;

fn header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims = match shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    let total = 10 + h.len() + 1;
    h.push_str(&" ".repeat((64 - total % 64) % 64));
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out
}

/// Streams an array to `path`: `fill` is called with a writer and must write exactly
/// `shape.product()` elements of `descr` (`<f4` or `<i4`), little-endian.
pub fn write_with(
    path: &Path,
    descr: &str,
    shape: &[usize],
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    crate::atomic_file::replace_with(path, |w| {
        w.write_all(&header(descr, shape))?;
        fill(w)
    })
}

/// Writes an f32 array.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    write_with(path, "<f4", shape, |w| {
        for x in data {
            w.write_all(&x.to_le_bytes())?;
        }
        Ok(())
    })
}

/// Writes an i32 array.
pub fn write_i32(path: &Path, shape: &[usize], data: &[i32]) -> Result<()> {
    write_with(path, "<i4", shape, |w| {
        for x in data {
            w.write_all(&x.to_le_bytes())?;
        }
        Ok(())
    })
}

/// An array read back: shape and values widened to f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f64>,
}

/// Reads an `<f4`, `<f8` or `<i4` C-order .npy file.
pub fn read(path: &Path) -> Result<Array> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .read_to_end(&mut bytes)?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("{}: not a .npy file", path.display());
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => bail!("{}: unsupported .npy version {v}", path.display()),
    };
    let h = std::str::from_utf8(&bytes[start..start + hlen])?;
    let field = |key: &str| -> Result<&str> {
        let i = h
            .find(key)
            .with_context(|| format!("{}: header has no {key}", path.display()))?;
        Ok(&h[i + key.len()..])
    };
    let descr = field("'descr': '")?.split('\'').next().unwrap_or("");
    if field("'fortran_order': ")?.starts_with("True") {
        bail!("{}: fortran order is not supported", path.display());
    }
    let dims = field("'shape': (")?.split(')').next().unwrap_or("");
    let shape: Vec<usize> = dims
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("{}: bad shape ({dims})", path.display()))?;
    let body = &bytes[start + hlen..];
    let n: usize = shape.iter().product();
    let data: Vec<f64> = match descr {
        "<f4" => body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        "<f8" => body
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "<i4" => body
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        d => bail!("{}: unsupported dtype {d}", path.display()),
    };
    if data.len() != n {
        bail!(
            "{}: {} elements for shape {shape:?}",
            path.display(),
            data.len()
        );
    }
    Ok(Array { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_aligned_header() {
        let dir = tempfile::tempdir().unwrap();
        for shape in [vec![], vec![3], vec![2, 3]] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
            let p = dir.path().join("a.npy");
            write_f32(&p, &shape, &data).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!((bytes.len() - 4 * n) % 64, 0, "header must be 64-aligned");
            let a = read(&p).unwrap();
            assert_eq!(a.shape, shape);
            assert_eq!(a.data, data.iter().map(|&x| x as f64).collect::<Vec<_>>());
        }
    }
}
