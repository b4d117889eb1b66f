//! CRC-32 (ISO-HDLC, the zlib one) of the chunks the agent writes, computed
//! without any CPU feature detection.
//!
//! crc32fast, which the reader uses, picks its carry-less multiplication path
//! at run time with `cpuid`; in a virtual machine each `cpuid` traps to the
//! hypervisor, and the detection cost every traced process image about
//! 90 microseconds on its writer thread (a tenth of what the agent added to
//! a fork and exec of `/bin/true`). This table-driven version (slicing by 8,
//! about 2 GB/s) checksums the chunks of a whole cc1 compile in about a
//! tenth of a second on the writer's core. Both compute the same function
//! (the tests compare them).

const POLY: u32 = 0xEDB8_8320;

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// A running CRC-32.
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    pub fn new() -> Crc32 {
        Crc32 { state: !0 }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        let t = &TABLES;
        let mut c = self.state;
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ c;
            let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
            c = t[7][(lo & 0xFF) as usize]
                ^ t[6][(lo >> 8 & 0xFF) as usize]
                ^ t[5][(lo >> 16 & 0xFF) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][(hi & 0xFF) as usize]
                ^ t[2][(hi >> 8 & 0xFF) as usize]
                ^ t[1][(hi >> 16 & 0xFF) as usize]
                ^ t[0][(hi >> 24) as usize];
        }
        for &b in words.remainder() {
            c = (c >> 8) ^ t[0][((c ^ u32::from(b)) & 0xFF) as usize];
        }
        self.state = c;
    }

    pub fn finalize(&self) -> u32 {
        !self.state
    }
}

#[cfg(test)]
mod tests {
    use super::Crc32;

    #[test]
    fn agrees_with_crc32fast_on_every_length_and_split() {
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(
            {
                let mut c = Crc32::new();
                c.update(b"123456789");
                c.finalize()
            },
            0xCBF4_3926
        );
        for len in (0..200).chain([1000, 4096, 4999, 5000]) {
            for split in [0, 1, 7, 8, 9, len / 2] {
                let split = split.min(len);
                let mut ours = Crc32::new();
                ours.update(&data[..split]);
                ours.update(&data[split..len]);
                assert_eq!(
                    ours.finalize(),
                    crc32fast::hash(&data[..len]),
                    "len {len} split {split}"
                );
            }
        }
    }
}
