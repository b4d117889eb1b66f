//! The guest's root file system: busybox for the shell and tools, the
//! command with the shared libraries it loads, extra files and kernel
//! modules, and `/init`, which runs the command and powers the guest off.
//!
//! Everything is put at its host path, so the guest loads the same files
//! the host has and a trace's module paths name host files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cpio::{self, Archive};
use crate::VmError;

/// A statically linked busybox (Debian's busybox-static).
pub const BUSYBOX: &str = "/bin/busybox";
const APPLETS: &[&str] = &[
    "sh", "mount", "echo", "cat", "insmod", "poweroff", "mkdir", "grep", "gzip", "stty",
];

/// What the guest runs.
pub struct Guest<'a> {
    /// The command, resolved to a host path, and its arguments.
    pub program: &'a Path,
    pub argv: &'a [String],
    pub files: &'a [PathBuf],
    pub modules: &'a [PathBuf],
    /// Whether to dump the kernel's symbols to the second serial port.
    pub kernel_symbols: bool,
    /// Prefix of the marker lines `/init` prints (unique per recording).
    pub marker: &'a str,
}

/// The shared libraries `program` loads, as the host's dynamic loader
/// lists them, with the loader itself; an error for a static program.
pub fn libraries(program: &Path) -> Result<Vec<PathBuf>, VmError> {
    let data = std::fs::read(program)
        .map_err(|e| VmError::usage(format!("{}: {e}", program.display())))?;
    let interp = interpreter(&data).ok_or_else(|| {
        VmError::cannot_run(format!(
            "{} is not a dynamically linked x86-64 program (a static program, a script, another architecture): `trapline vm` traps a dynamic program's shared C library",
            program.display()
        ))
    })?;
    let out = Command::new(&interp)
        .arg("--list")
        .arg(program)
        .output()
        .map_err(|e| VmError::cannot_run(format!("{interp}: {e}")))?;
    if !out.status.success() {
        return Err(VmError::cannot_run(format!(
            "{interp} --list {} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut libs = vec![PathBuf::from(&interp)];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(path) = loaded_path(line) {
            if !libs.contains(&path) {
                libs.push(path);
            }
        }
    }
    Ok(libs)
}

/// The path of a `ld.so --list` line, when it names a file.
pub fn loaded_path(line: &str) -> Option<PathBuf> {
    let line = line.trim();
    let path = match line.split_once(" => ") {
        Some((_, rest)) => rest.split(" (").next()?,
        None => line.split(" (").next()?,
    };
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// `PT_INTERP` of an x86-64 ELF file.
pub fn interpreter(data: &[u8]) -> Option<String> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::Endianness;
    let file = ElfFile64::<Endianness>::parse(data).ok()?;
    if file.elf_header().e_machine.get(file.endian()) != object::elf::EM_X86_64 {
        return None;
    }
    file.elf_program_headers()
        .iter()
        .find(|p| p.p_type(file.endian()) == object::elf::PT_INTERP)
        .and_then(|p| p.data(file.endian(), data).ok())
        .map(|d| {
            String::from_utf8_lossy(d)
                .trim_end_matches('\0')
                .to_string()
        })
}

/// Quotes a word for the guest's shell.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The `/init` script.
pub fn init_script(guest: &Guest) -> String {
    let m = guest.marker;
    let program = quoted(&guest.program.to_string_lossy());
    let mut args = String::new();
    for a in guest.argv.iter().skip(1) {
        args.push(' ');
        args.push_str(&quoted(a));
    }
    let mut s = String::from("#!/bin/busybox sh\n");
    s.push_str("mount -t proc proc /proc\nmount -t devtmpfs dev /dev\nmkdir -p /tmp\n");
    // Libraries load at the same addresses in every run, so the replay can
    // find them from the loader's list below.
    s.push_str("echo 0 > /proc/sys/kernel/randomize_va_space\n");
    for module in guest.modules {
        let path = quoted(&module.to_string_lossy());
        s.push_str(&format!(
            "insmod {path} || {{ echo {m}-FAILED insmod {path}; poweroff -f; }}\n"
        ));
    }
    s.push_str(&format!("echo {m}-LIBRARIES\n"));
    s.push_str(&format!("LD_TRACE_LOADED_OBJECTS=1 {program}\n"));
    s.push_str(&format!("echo {m}-RUN\n"));
    s.push_str("cd /tmp\n");
    s.push_str(&format!(
        "sh -c 'echo {m}-PID $$; exec \"$0\" \"$@\"' {program}{args} </dev/null\n"
    ));
    s.push_str(&format!("echo {m}-EXIT $?\n"));
    if guest.kernel_symbols {
        // The modules' code symbols, whose addresses depend on what was
        // loaded: the kernel's own come from a boot of their own
        // (`symbols_initramfs`), since a serial port is slow under TCG and
        // its output is in the recording and in every replay.
        s.push_str("stty -F /dev/ttyS1 raw -echo\n");
        s.push_str("grep ' [tT] ' /proc/kallsyms | grep '\\[' | gzip -1 > /dev/ttyS1\n");
    }
    s.push_str(&format!("echo {m}-DONE\npoweroff -f\n"));
    s
}

/// The initramfs for `guest`.
pub fn initramfs(guest: &Guest) -> Result<Vec<u8>, VmError> {
    let mut files: Vec<PathBuf> = libraries(guest.program)?;
    files.push(guest.program.to_path_buf());
    files.extend(guest.files.iter().cloned());
    files.extend(guest.modules.iter().cloned());
    archive(&files, &init_script(guest))
}

/// The `/init` of the boot that dumps the kernel's own code symbols
/// (compressed, through the second serial port in raw mode). Without
/// address randomization they are the same in every boot of the kernel.
pub const SYMBOLS_INIT: &str = "#!/bin/busybox sh
mount -t proc proc /proc
mount -t devtmpfs dev /dev
stty -F /dev/ttyS1 raw -echo
grep ' [tT] ' /proc/kallsyms | grep -v '\\[' | gzip -1 > /dev/ttyS1
poweroff -f
";

/// An initramfs of busybox, `files` at their paths, and `init`.
pub fn archive(files: &[PathBuf], init: &str) -> Result<Vec<u8>, VmError> {
    let mut dirs = BTreeSet::new();
    for d in ["bin", "dev", "proc", "sys", "tmp"] {
        dirs.insert(PathBuf::from("/").join(d));
    }
    for f in files {
        let mut p = f.parent();
        while let Some(d) = p {
            if d != Path::new("/") {
                dirs.insert(d.to_path_buf());
            }
            p = d.parent();
        }
    }
    let mut archive = Archive::default();
    for d in &dirs {
        archive.add(&d.to_string_lossy(), cpio::DIRECTORY | 0o755, &[], (0, 0));
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    archive.add("dev/console", cpio::CHAR_DEVICE | 0o600, &[], (5, 1));
    let busybox = std::fs::read(BUSYBOX).map_err(|e| {
        VmError::cannot_run(format!(
            "{BUSYBOX}: {e} (the guest's shell: install Debian's busybox-static)"
        ))
    })?;
    archive.add(BUSYBOX, cpio::REGULAR | 0o755, &busybox, (0, 0));
    for applet in APPLETS {
        archive.add(
            &format!("bin/{applet}"),
            cpio::SYMLINK | 0o777,
            b"busybox",
            (0, 0),
        );
    }
    let mut added = BTreeSet::new();
    for f in files {
        if !added.insert(f.clone()) || f == Path::new(BUSYBOX) {
            continue;
        }
        let data = std::fs::read(f).map_err(|e| VmError::usage(format!("{}: {e}", f.display())))?;
        let mode = std::fs::metadata(f)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .unwrap_or(0o755);
        archive.add(&f.to_string_lossy(), cpio::REGULAR | mode, &data, (0, 0));
    }
    archive.add("init", cpio::REGULAR | 0o755, init.as_bytes(), (0, 0));
    Ok(archive.finish())
}
