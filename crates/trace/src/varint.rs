//! LEB128 variable-length integers, the building block of every event.

/// The most bytes one encoded `u64` can take.
pub const MAX_VARINT_LEN: usize = 10;

/// Writes `value` at the start of `out` and returns the number of bytes used.
///
/// `out` must have room for [`MAX_VARINT_LEN`] bytes; the agent checks capacity
/// once per event rather than once per field.
#[inline(always)]
pub fn put_u64(out: &mut [u8], value: u64) -> usize {
    // Most fields (time deltas, sizes, stack ids) fit in one or two bytes.
    if value < 0x80 {
        out[0] = value as u8;
        return 1;
    }
    if value < 0x4000 {
        out[0] = (value as u8) | 0x80;
        out[1] = (value >> 7) as u8;
        return 2;
    }
    put_u64_long(out, value)
}

/// `put_u64` for values of three bytes and more, out of line: inlined, the
/// compiler unrolls it into ten steps, and the hot events' encoders grew too
/// large to be inlined into the agent's hooks.
#[inline(never)]
fn put_u64_long(out: &mut [u8], mut value: u64) -> usize {
    let mut i = 0;
    while value >= 0x80 {
        out[i] = (value as u8) | 0x80;
        value >>= 7;
        i += 1;
    }
    out[i] = value as u8;
    i + 1
}

/// Zig-zag maps a signed delta so small magnitudes of either sign stay short.
#[inline]
pub fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Reads one varint from `input` at `*pos`, advancing `*pos`. `None` when the
/// input ends inside the varint or the value overflows 64 bits.
#[inline]
pub fn get_u64(input: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *input.get(*pos)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_edges() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut buf = [0u8; MAX_VARINT_LEN];
            let n = put_u64(&mut buf, v);
            let mut pos = 0;
            assert_eq!(get_u64(&buf[..n], &mut pos), Some(v));
            assert_eq!(pos, n);
        }
        for v in [0i64, 1, -1, i64::MIN, i64::MAX, -4096] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn rejects_overlong_and_truncated() {
        let mut pos = 0;
        assert_eq!(get_u64(&[0x80, 0x80], &mut pos), None);
        let mut pos = 0;
        assert_eq!(get_u64(&[0xff; 11], &mut pos), None);
        let mut pos = 0;
        assert_eq!(
            get_u64(
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                &mut pos
            ),
            None
        );
    }
}
