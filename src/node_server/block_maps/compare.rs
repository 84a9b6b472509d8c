//! Two files' bytes compared over a range where their extent maps cannot tell: read in 1 MiB
//! chunks, compared in granules, the differing granules reported. A side that is a hole there
//! is not read: it is zeros.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{Batcher, Sink};

/// The unit of comparison: the filesystems' block (a rewrite touches whole blocks).
pub const GRANULE: u64 = 4096;
/// Bytes read from each file at a time.
const CHUNK: u64 = 1 << 20;

/// The two read buffers, allocated once per map and grown only as far as a range needs.
#[derive(Default)]
pub struct Buffers(Vec<u8>, Vec<u8>);

/// Reports the granules of `start..end` whose bytes differ between `base` and `target` (`None`:
/// a hole, zeros).
pub fn differing<S: Sink>(
    base: Option<&File>,
    target: Option<&File>,
    (start, end): (u64, u64),
    Buffers(a, b): &mut Buffers,
    out: &mut Batcher<'_, S>,
) -> io::Result<()> {
    let most = (end - start).min(CHUNK) as usize;
    if a.len() < most {
        a.resize(most, 0);
        b.resize(most, 0);
    }
    let mut at = start;
    while at < end && out.open() {
        let len = (end - at).min(CHUNK) as usize;
        let (a, b) = (&mut a[..len], &mut b[..len]);
        read_at(base, a, at)?;
        read_at(target, b, at)?;
        let mut offset = 0;
        while offset < len {
            let step = (GRANULE - (at + offset as u64) % GRANULE).min((len - offset) as u64);
            let step = step as usize;
            if a[offset..offset + step] != b[offset..offset + step] {
                let from = at + offset as u64;
                out.push(from, from + step as u64);
            }
            offset += step;
        }
        at += len as u64;
    }
    Ok(())
}

/// Fills `buf` from `offset`; bytes past the end of the file read as zeros (both snapshots
/// have the volume's size, but a short read must not be taken for a difference or an error).
fn read_at(file: Option<&File>, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let Some(file) = file else {
        buf.fill(0);
        return Ok(());
    };
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
