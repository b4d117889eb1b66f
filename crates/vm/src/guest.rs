//! The guest's root file system: busybox for the shell and tools, the
//! command with the shared libraries it loads, the files its arguments
//! name, `--file`s (files and whole directory trees), kernel modules, the
//! host's current directory, and `/init`, which runs the command there
//! (stopping it at `--timeout`, in guest time) and powers the guest off.
//!
//! Everything is put at its host path, so the guest loads the same files
//! the host has and a trace's module paths name host files.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cpio::{self, Archive};
use crate::VmError;

/// A statically linked busybox (Debian's busybox-static).
pub const BUSYBOX: &str = "/bin/busybox";
const APPLETS: &[&str] = &[
    "sh", "mount", "echo", "cat", "insmod", "poweroff", "mkdir", "grep", "gzip", "stty", "sleep",
    "kill", "stat", "mkfifo",
];

/// Where `/init` keeps the command's output and its watchdog's pipe.
const INIT_DIR: &str = "/.trapline";

/// After SIGTERM at `--timeout`, the guest seconds the command has to end
/// before SIGKILL (`trapline run --timeout`'s grace, in guest time).
pub const TERM_GRACE_SECONDS: u64 = 10;

/// What the guest runs.
pub struct Guest<'a> {
    /// The command, resolved to a host path, and its arguments.
    pub program: &'a Path,
    pub argv: &'a [String],
    /// `--file`s, absolute: regular files and directory trees.
    pub files: &'a [PathBuf],
    pub modules: &'a [PathBuf],
    /// The host's current directory, absolute: the command starts there,
    /// and its relative file arguments are found from it.
    pub cwd: &'a Path,
    /// Guest time after which `/init` stops the command (SIGTERM, then
    /// SIGKILL [`TERM_GRACE_SECONDS`] later).
    pub timeout: Option<Duration>,
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

/// Seconds for busybox's `sleep`: "20", "0.5".
fn seconds(d: Duration) -> String {
    let text = format!("{:.3}", d.as_secs_f64());
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() {
        "0".into()
    } else {
        text.into()
    }
}

/// `path` made absolute from `cwd` and cleaned of `.` and `..` by its
/// words alone (the guest has no symbolic links on the way, unless a
/// carried tree has them).
pub fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in cwd.join(path).components() {
        match c {
            Component::Normal(w) => out.push(w),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
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
    let out = format!("{INIT_DIR}/stdout");
    let err = format!("{INIT_DIR}/stderr");
    let mut s = String::from("#!/bin/busybox sh\n");
    s.push_str(&format!(
        "mount -t proc proc /proc\nmount -t devtmpfs dev /dev\nmkdir -p /tmp {INIT_DIR}\n"
    ));
    // Libraries load at the same addresses in every run, so the replay can
    // find them from the loader's list below.
    s.push_str("echo 0 > /proc/sys/kernel/randomize_va_space\n");
    for module in guest.modules {
        let path = quoted(&module.to_string_lossy());
        s.push_str(&format!(
            "insmod {path} || {{ echo {m}-FAILED insmod {path}; poweroff -f; }}\n"
        ));
    }
    // The console passes bytes unchanged (no "\n" to "\r\n"): the
    // command's output is copied to it by its length in bytes.
    s.push_str("stty -opost\n");
    s.push_str(&format!("echo {m}-LIBRARIES\n"));
    s.push_str(&format!("LD_TRACE_LOADED_OBJECTS=1 {program}\n"));
    s.push_str(&format!("echo {m}-RUN\n"));
    let cwd = quoted(&guest.cwd.to_string_lossy());
    s.push_str(&format!(
        "cd {cwd} || {{ echo {m}-FAILED cd {cwd}; poweroff -f; }}\n"
    ));
    s.push_str(&format!(": > {out}\n: > {err}\n"));
    // The command's stdout and stderr are files, not the console's tty, so
    // it prints no terminal codes and buffers as under a pipe.
    let mut start = format!("echo {m}-PID $$; ");
    if let Some(limit) = guest.timeout {
        // The watchdog learns the pid through a pipe (no polling) and
        // sleeps in guest time: the clock is the instruction count.
        let fifo = format!("{INIT_DIR}/pid");
        s.push_str(&format!("mkfifo {fifo}\n"));
        // Told before the signal: once the command ends, `/init` goes on
        // and kills the watchdog.
        s.push_str(&format!(
            "stop() {{ kill -0 $pid 2>/dev/null && echo {m}-STOPPED $1 && kill -$1 $pid; }}\n"
        ));
        s.push_str(&format!(
            "( read pid < {fifo}; sleep {}; stop TERM; sleep {TERM_GRACE_SECONDS}; stop KILL ) </dev/null >/dev/console 2>/dev/null &\nwatchdog=$!\n",
            seconds(limit)
        ));
        start.push_str(&format!("echo $$ > {fifo}; "));
    }
    s.push_str(&format!(
        "sh -c '{start}exec \"$0\" \"$@\" >{out} 2>{err}' {program}{args} </dev/null\n"
    ));
    s.push_str("status=$?\n");
    if guest.timeout.is_some() {
        s.push_str("kill -KILL $watchdog 2>/dev/null\n");
    }
    s.push_str(&format!("echo {m}-EXIT $status\n"));
    for (word, file) in [("STDOUT", &out), ("STDERR", &err)] {
        s.push_str(&format!(
            "echo {m}-{word} $(stat -c %s {file})\ncat {file}\necho\n"
        ));
    }
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

/// One entry of the guest's file system besides busybox and `/init`.
#[derive(Clone, Debug, PartialEq)]
enum Entry {
    Directory {
        mode: u32,
    },
    /// A regular file, read from `source` on the host.
    File {
        source: PathBuf,
        mode: u32,
        size: u64,
    },
    Symlink {
        target: PathBuf,
    },
}

/// What the initramfs carries, by guest path (sorted: a directory before
/// what it holds), with the warnings of what was left out.
#[derive(Default, Debug)]
pub struct Contents {
    entries: BTreeMap<PathBuf, Entry>,
    pub warnings: Vec<String>,
}

/// Paths the guest's own files take.
fn reserved(path: &Path) -> bool {
    path == Path::new("/init")
        || path == Path::new(BUSYBOX)
        || path == Path::new(INIT_DIR)
        || path.starts_with(INIT_DIR)
        || path == Path::new("/dev/console")
        || ["/proc", "/sys", "/dev"]
            .iter()
            .any(|d| path.starts_with(d) && path != Path::new(d))
        || APPLETS
            .iter()
            .any(|a| path == Path::new("/bin").join(a).as_path())
}

fn mode_of(meta: &std::fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777
}

impl Contents {
    /// Everything `guest` needs: its program and libraries, the files its
    /// arguments name, its `--file`s and modules, and its directory.
    pub fn of(guest: &Guest) -> Result<Contents, VmError> {
        let mut c = Contents::default();
        for lib in libraries(guest.program)? {
            c.file(&lib, &lib, true)?;
        }
        c.file(guest.program, guest.program, true)?;
        for f in guest.files {
            c.explicit(f)?;
        }
        for (at, source) in argument_files(guest.argv, guest.cwd) {
            // A link a carried tree has already stays a link.
            if c.entries.contains_key(&at) {
                continue;
            }
            if let Err(e) = c.file(&at, &source, true) {
                c.left_out(&source, &e);
            }
        }
        for m in guest.modules {
            c.file(m, m, true)?;
        }
        c.add(
            guest.cwd.to_path_buf(),
            Entry::Directory { mode: 0o755 },
            true,
        );
        Ok(c)
    }

    /// A `--file`: a regular file, or a directory and all it holds.
    pub fn explicit(&mut self, path: &Path) -> Result<(), VmError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| VmError::usage(format!("--file {}: {e}", path.display())))?;
        if meta.is_dir() {
            std::fs::read_dir(path)
                .map_err(|e| VmError::usage(format!("--file {}: {e}", path.display())))?;
            self.add(
                path.to_path_buf(),
                Entry::Directory {
                    mode: mode_of(&meta),
                },
                true,
            );
            self.tree(path, path);
            Ok(())
        } else if meta.is_file() {
            self.file(path, path, true)
                .map_err(|e| VmError::usage(format!("--file {}: {e}", path.display())))
        } else {
            Err(VmError::usage(format!(
                "--file {}: not a regular file or a directory",
                path.display()
            )))
        }
    }

    /// A regular file at `at`, read from `source`, which must be readable.
    fn file(&mut self, at: &Path, source: &Path, explicit: bool) -> Result<(), VmError> {
        let opened = std::fs::File::open(source)
            .and_then(|f| f.metadata())
            .map_err(|e| VmError::usage(format!("{}: {e}", source.display())))?;
        if !opened.is_file() {
            return Err(VmError::usage(format!(
                "{}: not a regular file",
                source.display()
            )));
        }
        self.add(
            at.to_path_buf(),
            Entry::File {
                source: source.to_path_buf(),
                mode: mode_of(&opened),
                size: opened.len(),
            },
            explicit,
        );
        Ok(())
    }

    /// Warns that `path` is not carried, and why.
    fn left_out(&mut self, path: &Path, why: &dyn std::fmt::Display) {
        self.warnings.push(format!(
            "{}: not carried into the guest ({why})",
            path.display()
        ));
    }

    fn add(&mut self, at: PathBuf, entry: Entry, explicit: bool) {
        if at == Path::new("/") {
            return;
        }
        if reserved(&at) {
            if explicit && !matches!(entry, Entry::Directory { .. }) {
                self.warnings.push(format!(
                    "{}: not carried into the guest, whose own file it is",
                    at.display()
                ));
            }
            return;
        }
        match self.entries.get(&at) {
            None => {
                self.entries.insert(at, entry);
            }
            Some(old) if std::mem::discriminant(old) == std::mem::discriminant(&entry) => {}
            Some(_) => self.warnings.push(format!(
                "{}: carried once already as another kind of file; this one is left out",
                at.display()
            )),
        }
    }

    /// What the directory `dir` (at `at` in the guest, inside the carried
    /// tree `root`) holds: unreadable entries and special files are left
    /// out with a warning.
    fn tree(&mut self, root: &Path, dir: &Path) {
        let read = match std::fs::read_dir(dir) {
            Ok(r) => r,
            Err(e) => {
                self.left_out(dir, &e);
                return;
            }
        };
        let mut names: Vec<_> = read.filter_map(|e| e.ok().map(|e| e.file_name())).collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    self.left_out(&path, &e);
                    continue;
                }
            };
            let kind = meta.file_type();
            if kind.is_symlink() {
                let target = match std::fs::read_link(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        self.left_out(&path, &e);
                        continue;
                    }
                };
                // Where the guest will look: a target outside the tree is
                // carried too when it is a file.
                let resolved = absolute(&target, dir);
                self.add(path.clone(), Entry::Symlink { target }, false);
                if !resolved.starts_with(root) {
                    match std::fs::metadata(&path) {
                        Ok(m) if m.is_file() => {
                            if let Err(e) = self.file(&resolved, &path, false) {
                                self.left_out(&resolved, &e);
                            }
                        }
                        Ok(m) if m.is_dir() => self.warnings.push(format!(
                            "{}: a symbolic link to {}, a directory outside {}, which is not carried (add --file {})",
                            path.display(),
                            resolved.display(),
                            root.display(),
                            resolved.display()
                        )),
                        _ => {}
                    }
                }
            } else if kind.is_dir() {
                self.add(
                    path.clone(),
                    Entry::Directory {
                        mode: mode_of(&meta),
                    },
                    false,
                );
                self.tree(root, &path);
            } else if kind.is_file() {
                if let Err(e) = self.file(&path, &path, false) {
                    self.warnings
                        .push(format!("{}: not carried into the guest", e.message));
                }
            } else {
                self.warnings.push(format!(
                    "{}: not a regular file, directory or symbolic link: not carried into the guest",
                    path.display()
                ));
            }
        }
    }

    /// The bytes of the archive these contents make, about (busybox
    /// included), known before any file is read.
    pub fn size(&self) -> u64 {
        let busybox = std::fs::metadata(BUSYBOX).map_or(0, |m| m.len());
        let data: u64 = self
            .entries
            .values()
            .map(|e| match e {
                Entry::File { size, .. } => *size,
                Entry::Symlink { target } => target.as_os_str().len() as u64,
                Entry::Directory { .. } => 0,
            })
            .sum();
        busybox + data + 256 * (self.entries.len() as u64 + 64)
    }

    /// The regular files carried, by guest path.
    pub fn files(&self) -> Vec<&Path> {
        self.entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::File { .. }))
            .map(|(p, _)| p.as_path())
            .collect()
    }
}

/// The command's arguments that name an existing host regular file (from
/// `cwd`, or absolute): where the guest will find each, and where the host
/// reads it.
pub fn argument_files(argv: &[String], cwd: &Path) -> Vec<(PathBuf, PathBuf)> {
    argv.iter()
        .skip(1)
        .filter(|a| !a.is_empty())
        .filter_map(|a| {
            let source = cwd.join(a);
            source
                .is_file()
                .then(|| (absolute(Path::new(a), cwd), source))
        })
        .collect()
}

/// The initramfs for `guest`, of `contents` (from [`Contents::of`]).
pub fn initramfs(guest: &Guest, contents: &Contents) -> Result<Vec<u8>, VmError> {
    build(contents, &init_script(guest))
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

/// An initramfs of busybox and `init` alone.
pub fn archive(init: &str) -> Result<Vec<u8>, VmError> {
    build(&Contents::default(), init)
}

/// An initramfs of busybox, `contents` at their paths, and `init`, in
/// sorted order with no times: the same inputs give the same bytes.
fn build(contents: &Contents, init: &str) -> Result<Vec<u8>, VmError> {
    let mut dirs: BTreeMap<PathBuf, u32> = BTreeMap::new();
    for d in ["bin", "dev", "proc", "sys", "tmp"] {
        dirs.insert(PathBuf::from("/").join(d), 0o755);
    }
    for (path, entry) in &contents.entries {
        let mut p = path.parent();
        while let Some(d) = p {
            if d != Path::new("/") {
                dirs.entry(d.to_path_buf()).or_insert(0o755);
            }
            p = d.parent();
        }
        if let Entry::Directory { mode } = entry {
            dirs.insert(path.clone(), *mode | 0o700);
        }
    }
    let mut archive = Archive::default();
    for (d, mode) in &dirs {
        archive.add(&d.to_string_lossy(), cpio::DIRECTORY | mode, &[], (0, 0));
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
    for (path, entry) in &contents.entries {
        let name = path.to_string_lossy();
        match entry {
            Entry::Directory { .. } => {}
            // A link where a carried file needs a directory is left out.
            Entry::Symlink { .. } if dirs.contains_key(path) => {}
            Entry::Symlink { target } => {
                use std::os::unix::ffi::OsStrExt;
                archive.add(
                    &name,
                    cpio::SYMLINK | 0o777,
                    target.as_os_str().as_bytes(),
                    (0, 0),
                );
            }
            Entry::File { source, mode, .. } => {
                let data = std::fs::read(source)
                    .map_err(|e| VmError::usage(format!("{}: {e}", source.display())))?;
                archive.add(&name, cpio::REGULAR | mode, &data, (0, 0));
            }
        }
    }
    archive.add("init", cpio::REGULAR | 0o755, init.as_bytes(), (0, 0));
    Ok(archive.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("trapline-guest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn guest<'a>(argv: &'a [String], files: &'a [PathBuf], cwd: &'a Path) -> Guest<'a> {
        Guest {
            program: Path::new("/usr/bin/prog"),
            argv,
            files,
            modules: &[],
            cwd,
            timeout: None,
            kernel_symbols: false,
            marker: "M",
        }
    }

    #[test]
    fn paths_are_made_absolute_by_their_words() {
        let cwd = Path::new("/home/u/work");
        assert_eq!(
            absolute(Path::new("a.json"), cwd),
            Path::new("/home/u/work/a.json")
        );
        assert_eq!(
            absolute(Path::new("./x/../b"), cwd),
            Path::new("/home/u/work/b")
        );
        assert_eq!(absolute(Path::new("../../../../c"), cwd), Path::new("/c"));
        assert_eq!(
            absolute(Path::new("/etc//passwd"), cwd),
            Path::new("/etc/passwd")
        );
        assert_eq!(seconds(Duration::from_secs(20)), "20");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5");
    }

    #[test]
    fn init_starts_the_command_in_the_hosts_directory_with_its_output_in_files() {
        let argv = ["prog".to_string(), "it's.json".to_string()];
        let g = guest(&argv, &[], Path::new("/home/u/my dir"));
        let s = init_script(&g);
        assert!(s.contains("cd '/home/u/my dir' || {"), "{s}");
        assert!(
            s.contains(
                "sh -c 'echo M-PID $$; exec \"$0\" \"$@\" >/.trapline/stdout 2>/.trapline/stderr' '/usr/bin/prog' 'it'\\''s.json' </dev/null\nstatus=$?\n"
            ),
            "{s}"
        );
        assert!(s.contains("stty -opost\n"), "{s}");
        assert!(!s.contains("sleep"), "no watchdog without a timeout: {s}");
        let exit = s.find("echo M-EXIT $status").unwrap();
        let out = s
            .find("echo M-STDOUT $(stat -c %s /.trapline/stdout)\ncat /.trapline/stdout\necho\n")
            .unwrap();
        let err = s
            .find("echo M-STDERR $(stat -c %s /.trapline/stderr)\ncat /.trapline/stderr\necho\n")
            .unwrap();
        assert!(exit < out && out < err && err < s.find("M-DONE").unwrap());
    }

    #[test]
    fn init_stops_the_command_at_the_timeout_in_guest_time() {
        let argv = ["prog".to_string()];
        let mut g = guest(&argv, &[], Path::new("/"));
        g.timeout = Some(Duration::from_millis(2500));
        let s = init_script(&g);
        assert!(
            s.contains("stop() { kill -0 $pid 2>/dev/null && echo M-STOPPED $1 && kill -$1 $pid; }\n( read pid < /.trapline/pid; sleep 2.5; stop TERM; sleep 10; stop KILL ) </dev/null >/dev/console 2>/dev/null &\nwatchdog=$!\n"),
            "{s}"
        );
        assert!(
            s.contains("sh -c 'echo M-PID $$; echo $$ > /.trapline/pid; exec "),
            "{s}"
        );
        let status = s.find("status=$?").unwrap();
        assert!(
            s[status..]
                .starts_with("status=$?\nkill -KILL $watchdog 2>/dev/null\necho M-EXIT $status\n"),
            "{s}"
        );
        assert!(s.find("mkfifo /.trapline/pid").unwrap() < s.find("watchdog=$!").unwrap());
    }

    /// Parses a "newc" archive: (name, mode, data) of each entry.
    fn entries(bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        let field = |at: usize, i: usize| {
            u32::from_str_radix(
                std::str::from_utf8(&bytes[at + 6 + 8 * i..at + 14 + 8 * i]).unwrap(),
                16,
            )
            .unwrap() as usize
        };
        loop {
            assert_eq!(&bytes[pos..pos + 6], b"070701");
            let (mode, size, name_len) = (field(pos, 1), field(pos, 6), field(pos, 11));
            let name_at = pos + 110;
            let name = String::from_utf8(bytes[name_at..name_at + name_len - 1].to_vec()).unwrap();
            let data_at = (name_at + name_len).next_multiple_of(4);
            if name == "TRAILER!!!" {
                return out;
            }
            out.push((name, mode as u32, bytes[data_at..data_at + size].to_vec()));
            pos = (data_at + size).next_multiple_of(4);
        }
    }

    #[test]
    fn a_carried_tree_keeps_its_files_links_and_directories_in_order() {
        let dir = scratch("tree");
        let tree = dir.join("lib");
        std::fs::create_dir_all(tree.join("pkg/sub")).unwrap();
        std::fs::write(tree.join("pkg/sub/data.txt"), "nested\n").unwrap();
        std::fs::write(tree.join("top.py"), "x = 1\n").unwrap();
        std::os::unix::fs::symlink("pkg/sub/data.txt", tree.join("inside")).unwrap();
        std::fs::write(dir.join("outside.txt"), "out\n").unwrap();
        std::os::unix::fs::symlink("../outside.txt", tree.join("to-outside")).unwrap();
        std::os::unix::fs::symlink("no-such", tree.join("dangling")).unwrap();
        std::os::unix::fs::symlink("/", tree.join("root")).unwrap();
        std::fs::create_dir(dir.join("cwd")).unwrap();
        std::fs::write(dir.join("cwd/arg.json"), "{}").unwrap();

        let argv: Vec<String> = ["prog", "arg.json", "-", "missing.json", "../lib"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let files = [tree.clone()];
        let cwd = dir.join("cwd");
        let mut c = Contents::default();
        for (at, source) in argument_files(&argv, &cwd) {
            c.file(&at, &source, true).unwrap();
        }
        for f in &files {
            c.explicit(f).unwrap();
        }
        c.add(cwd.clone(), Entry::Directory { mode: 0o755 }, true);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("root: a symbolic link to /, a directory outside"),
            "{:?}",
            c.warnings
        );
        let init = init_script(&guest(&argv, &files, &cwd));
        let bytes = build(&c, &init).unwrap();
        assert_eq!(
            bytes,
            build(&c, &init).unwrap(),
            "the same inputs give the same bytes"
        );
        assert!(
            c.size() >= bytes.len() as u64 - 4096,
            "{} {}",
            c.size(),
            bytes.len()
        );

        let all = entries(&bytes);
        let name = |p: &Path| p.to_string_lossy().trim_start_matches('/').to_string();
        let find = |p: &Path| {
            all.iter().find(|e| e.0 == name(p)).unwrap_or_else(|| {
                panic!(
                    "{} not in {:?}",
                    p.display(),
                    all.iter().map(|e| &e.0).collect::<Vec<_>>()
                )
            })
        };
        let position = |p: &Path| all.iter().position(|e| e.0 == name(p)).unwrap();
        assert_eq!(find(&tree.join("pkg/sub/data.txt")).2, b"nested\n");
        assert_eq!(
            find(&tree.join("pkg/sub/data.txt")).1 & 0o170000,
            cpio::REGULAR
        );
        assert_eq!(find(&tree.join("pkg/sub")).1 & 0o170000, cpio::DIRECTORY);
        assert!(position(&tree.join("pkg")) < position(&tree.join("pkg/sub")));
        assert!(position(&tree.join("pkg/sub")) < position(&tree.join("pkg/sub/data.txt")));
        let inside = find(&tree.join("inside"));
        assert_eq!(
            (inside.1 & 0o170000, inside.2.as_slice()),
            (cpio::SYMLINK, &b"pkg/sub/data.txt"[..])
        );
        assert_eq!(find(&tree.join("dangling")).2, b"no-such");
        // A link out of the tree to a file brings the file, where the
        // guest will look for it.
        assert_eq!(find(&tree.join("to-outside")).2, b"../outside.txt");
        assert_eq!(find(&dir.join("outside.txt")).2, b"out\n");
        assert_eq!(find(&cwd.join("arg.json")).2, b"{}");
        assert_eq!(find(&cwd).1 & 0o170000, cpio::DIRECTORY);
        assert!(!all.iter().any(|e| e.0.ends_with("missing.json")));
        // Regular files only among the arguments: "../lib" is a directory.
        assert_eq!(argument_files(&argv, &cwd).len(), 1);
        assert_eq!(all.last().unwrap().0, "init");
        assert_eq!(all.last().unwrap().2, init.as_bytes());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_an_error_and_the_guests_own_files_stay_its() {
        let mut c = Contents::default();
        let err = c.explicit(Path::new("/no/such/file")).unwrap_err();
        assert_eq!(err.exit_code, crate::EXIT_USAGE);
        assert!(
            err.message.starts_with("--file /no/such/file: "),
            "{}",
            err.message
        );
        c.file(Path::new("/bin/sh"), Path::new(BUSYBOX), true)
            .unwrap();
        assert!(c.entries.is_empty());
        assert!(
            c.warnings[0].contains("/bin/sh: not carried"),
            "{:?}",
            c.warnings
        );
    }
}
