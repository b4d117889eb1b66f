//! A file read in 64 KiB blocks, each once, for `object`'s lazy reader.
//!
//! `object::read::ReadCache` reads only what is asked for, but it asks the
//! file for every symbol name separately: checking gcc's cc1 for a private
//! allocator took 28,000 `lseek` and `read` pairs (30 ms before every
//! `trapline run` of it). Serving those reads from cached blocks makes them
//! a few dozen reads of the string table's blocks.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

const BLOCK: u64 = 64 << 10;

/// `Read` and `Seek` over a file, through a cache of its blocks.
pub struct BlockFile {
    file: File,
    len: u64,
    pos: u64,
    blocks: HashMap<u64, Vec<u8>>,
}

impl BlockFile {
    pub fn new(file: File) -> io::Result<BlockFile> {
        let len = file.metadata()?.len();
        Ok(BlockFile {
            file,
            len,
            pos: 0,
            blocks: HashMap::new(),
        })
    }

    /// The block that holds `index * BLOCK`, read on first use.
    fn block(&mut self, index: u64) -> io::Result<&[u8]> {
        if !self.blocks.contains_key(&index) {
            let start = index * BLOCK;
            let mut data = vec![0u8; BLOCK.min(self.len - start) as usize];
            self.file.read_exact_at(&mut data, start)?;
            self.blocks.insert(index, data);
        }
        Ok(&self.blocks[&index])
    }
}

impl Read for BlockFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let (index, offset) = (self.pos / BLOCK, (self.pos % BLOCK) as usize);
        let block = self.block(index)?;
        let n = buf.len().min(block.len() - offset);
        buf[..n].copy_from_slice(&block[offset..offset + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlockFile {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::BlockFile;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn reads_across_blocks_and_at_the_end_as_the_file_does() {
        let path = std::env::temp_dir().join(format!("block_file_{}", std::process::id()));
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let mut f = BlockFile::new(std::fs::File::open(&path).unwrap()).unwrap();
        for &(at, len) in &[
            (0u64, 10usize),
            (65_530, 20),
            (131_000, 5_000),
            (199_990, 50),
        ] {
            f.seek(SeekFrom::Start(at)).unwrap();
            let mut got = vec![0u8; len];
            let mut filled = 0;
            while filled < len {
                let n = f.read(&mut got[filled..]).unwrap();
                if n == 0 {
                    break;
                }
                filled += n;
            }
            let end = (at as usize + len).min(bytes.len());
            assert_eq!(&got[..filled], &bytes[at as usize..end], "at {at}");
        }
        assert_eq!(f.seek(SeekFrom::End(-1)).unwrap(), 199_999);
        assert!(f.seek(SeekFrom::Current(-300_000)).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
