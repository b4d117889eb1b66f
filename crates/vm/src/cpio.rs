//! The initramfs archive: cpio's "newc" format, which the kernel unpacks
//! into its root file system before running `/init`.
//!
//! Hand-written: the format is a fixed ASCII header per entry, and the
//! archive must be byte-for-byte the same for the same inputs (no times,
//! no inode numbers from the host), which general cpio writers do not
//! promise.

/// File type bits of `st_mode`.
pub const DIRECTORY: u32 = 0o040000;
pub const REGULAR: u32 = 0o100000;
pub const SYMLINK: u32 = 0o120000;
pub const CHAR_DEVICE: u32 = 0o020000;

#[derive(Default)]
pub struct Archive {
    bytes: Vec<u8>,
    entries: u32,
}

impl Archive {
    /// Adds an entry; `device`: (major, minor) of a device node.
    pub fn add(&mut self, name: &str, mode: u32, data: &[u8], device: (u32, u32)) {
        self.entries += 1;
        let name = name.trim_start_matches('/');
        let fields = [
            self.entries,      // inode
            mode,              // mode
            0,                 // uid
            0,                 // gid
            1,                 // links
            0,                 // mtime
            data.len() as u32, // size
            0,                 // device major
            0,                 // device minor
            device.0,          // special file's major
            device.1,          // special file's minor
            name.len() as u32 + 1,
            0, // checksum (unused by "070701")
        ];
        self.bytes.extend_from_slice(b"070701");
        for f in fields {
            self.bytes.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    /// The archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.add("TRAILER!!!", 0, &[], (0, 0));
        self.bytes
    }
}
