//! A check that a plugin file is a complete ELF shared object before it is `dlopen`ed:
//! a file cut short (an interrupted copy or download) is mapped past its end by the
//! dynamic loader and the process dies of SIGBUS, which names no file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// `ET_DYN`: a shared object.
const ET_DYN: u16 = 3;
/// `PT_LOAD`: a segment the loader maps.
const PT_LOAD: u64 = 1;

/// Little- or big-endian reads of a header's fields.
struct Fields<'a> {
    b: &'a [u8],
    le: bool,
}

impl Fields<'_> {
    fn u16(&self, at: usize) -> u64 {
        let a = [self.b[at], self.b[at + 1]];
        (if self.le {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }) as u64
    }
    fn u32(&self, at: usize) -> u64 {
        let a: [u8; 4] = self.b[at..at + 4].try_into().unwrap();
        (if self.le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }) as u64
    }
    fn u64(&self, at: usize) -> u64 {
        let a: [u8; 8] = self.b[at..at + 8].try_into().unwrap();
        if self.le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    }
    /// An address-sized field (u64 in ELF64, u32 in ELF32).
    fn addr(&self, at64: usize, at32: usize, is64: bool) -> u64 {
        if is64 {
            self.u64(at64)
        } else {
            self.u32(at32)
        }
    }
}

/// Checks that `path` is an ELF shared object whose headers, loadable segments and
/// section header table all lie inside the file; the error says what is wrong in one
/// line ("truncated: the file is N bytes but ... ends at byte M").
pub(crate) fn check_complete(path: &Path) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let size = f
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?
        .len();
    let mut head = [0u8; 64];
    let n = read_up_to(&mut f, &mut head)?;
    if n < 16 || &head[..4] != b"\x7fELF" {
        return Err(format!(
            "not an ELF shared object ({size} bytes, no ELF header)"
        ));
    }
    let is64 = match head[4] {
        1 => false,
        2 => true,
        c => return Err(format!("not an ELF shared object (unknown ELF class {c})")),
    };
    let le = head[5] != 2;
    let ehsize = if is64 { 64 } else { 52 };
    let truncated = |what: &str, end: u64| {
        format!("truncated: the file is {size} bytes but its {what} ends at byte {end}")
    };
    if (n as u64) < ehsize {
        return Err(truncated("ELF header", ehsize));
    }
    let h = Fields { b: &head, le };
    if h.u16(16) != ET_DYN as u64 {
        return Err(format!(
            "not a shared object (ELF type {}, want {ET_DYN})",
            h.u16(16)
        ));
    }
    let phoff = h.addr(32, 28, is64);
    let (phentsize, phnum) = if is64 {
        (h.u16(54), h.u16(56))
    } else {
        (h.u16(42), h.u16(44))
    };
    let shoff = h.addr(40, 32, is64);
    let (shentsize, shnum) = if is64 {
        (h.u16(58), h.u16(60))
    } else {
        (h.u16(46), h.u16(48))
    };
    let ph_end = phoff.saturating_add(phentsize * phnum);
    if ph_end > size {
        return Err(truncated("program header table", ph_end));
    }
    let min_ph = if is64 { 40 } else { 32 };
    if phnum > 0 && phentsize < min_ph {
        return Err(format!(
            "malformed ELF: program header entries of {phentsize} bytes"
        ));
    }
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff))
        .and_then(|_| f.read_exact(&mut table))
        .map_err(|e| format!("cannot read its program headers: {e}"))?;
    let mut load_end = 0u64;
    for k in 0..phnum as usize {
        let p = Fields {
            b: &table[k * phentsize as usize..],
            le,
        };
        if p.u32(0) != PT_LOAD {
            continue;
        }
        let (offset, filesz) = if is64 {
            (p.u64(8), p.u64(32))
        } else {
            (p.u32(4), p.u32(16))
        };
        load_end = load_end.max(offset.saturating_add(filesz));
    }
    if load_end > size {
        return Err(truncated("loadable segments' data", load_end));
    }
    let sh_end = shoff.saturating_add(shentsize * shnum);
    if shnum > 0 && sh_end > size {
        return Err(truncated("section header table", sh_end));
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes from the start; how many were read.
fn read_up_to(f: &mut File, buf: &mut [u8]) -> Result<usize, String> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read it: {e}")),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_truncated_and_foreign_files() {
        let dir = std::env::temp_dir().join(format!("grpo-pjrt-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // This test binary's own libc is a complete shared object.
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file());
        if let Some(libc) = libc {
            assert_eq!(check_complete(libc), Ok(()));
            let bytes = std::fs::read(libc).unwrap();
            let cut = dir.join("cut.so");
            std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
            let e = check_complete(&cut).unwrap_err();
            assert!(e.starts_with("truncated: the file is"), "{e}");
            std::fs::write(&cut, &bytes[..40]).unwrap();
            assert!(check_complete(&cut).unwrap_err().contains("ELF header"));
        }
        let text = dir.join("text.so");
        std::fs::write(&text, "not a library").unwrap();
        assert!(check_complete(&text).unwrap_err().contains("not an ELF"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
