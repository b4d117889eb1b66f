//! The contract between `trapline run` and the agent it preloads, defined
//! once for both sides: the environment variables that carry the options,
//! the names of the trace files of a process tree, the control socket
//! `trapline watch` talks to, and which programs the dynamic loader can
//! preload the agent into. No allocation in [`elf`]: the
//! agent reads exec targets from vfork children.

#![forbid(unsafe_code)]

/// The environment variables `trapline run` sets for the agent.
pub mod env {
    /// The top process's trace path; every other image writes `PATH.<pid>`.
    pub const OUTPUT: &str = "TRAPLINE_OUTPUT";
    /// `top` for the command `trapline run` starts (its children have none).
    pub const ROLE: &str = "TRAPLINE_ROLE";
    /// The value of [`ROLE`] for the command.
    pub const ROLE_TOP: &str = "top";
    /// The pid of `trapline run`, for the command alone: it gets SIGKILL
    /// when `trapline run` dies (unless `--outlive`), as it would have
    /// with it, instead of running on orphaned and recording.
    pub const DIE_WITH: &str = "TRAPLINE_DIE_WITH";
    /// `0`: trace only the top process (`--no-follow`).
    pub const FOLLOW: &str = "TRAPLINE_FOLLOW";
    /// `1`: pass invalid and double frees on to the C library.
    pub const PASS_INVALID: &str = "TRAPLINE_PASS_INVALID";
    /// `0`: no freeres at exit (`--no-freeres`).
    pub const FREERES: &str = "TRAPLINE_FREERES";
    /// `0`: no stacks for releases (`--no-release-stacks`).
    pub const RELEASE_STACKS: &str = "TRAPLINE_RELEASE_STACKS";
    /// `0`: no reachability scan at exit (`--no-scan`).
    pub const SCAN: &str = "TRAPLINE_SCAN";
    /// Milliseconds between periodic scans (`--scan-every`).
    pub const SCAN_EVERY_MS: &str = "TRAPLINE_SCAN_EVERY";
    /// The periodic scans' budget of wall time, parts per million (`--scan-budget`).
    pub const SCAN_BUDGET_PPM: &str = "TRAPLINE_SCAN_BUDGET_PPM";
    /// CPU samples per second of each thread's CPU time (`--profile`).
    pub const PROFILE_HZ: &str = "TRAPLINE_PROFILE";
    /// `1`: `trapline run` was started with SIGPIPE ignored.
    pub const IGNORE_SIGPIPE: &str = "TRAPLINE_IGNORE_SIGPIPE";
    /// The agent library `trapline run` preloads, when not beside it.
    pub const AGENT: &str = "TRAPLINE_AGENT";
    /// `1`: serve the control socket (`--control`, `--watch`).
    pub const CONTROL: &str = "TRAPLINE_CONTROL";
    /// The recorders on, comma-separated from [`RECORD_MEMORY`] and
    /// [`RECORD_LOCKS`] (absent: both; CPU samples are `PROFILE_HZ`'s).
    /// A hook whose recorder is off passes the call straight on.
    pub const RECORD: &str = "TRAPLINE_RECORD";
    pub const RECORD_MEMORY: &str = "mem";
    pub const RECORD_LOCKS: &str = "locks";
    pub const RECORD_CPU: &str = "cpu";
    /// Sampled recording (`--sample`): the mean bytes allocated between
    /// two allocations that take a full stack (absent: every one does).
    pub const SAMPLE_BYTES: &str = "TRAPLINE_SAMPLE";
    /// Production mode (`--production`; `1`): only sampled allocations
    /// are recorded, with their releases; every call is counted by
    /// function. The mean is `SAMPLE_BYTES`'s (absent: the default).
    pub const PRODUCTION: &str = "TRAPLINE_PRODUCTION";
    /// The seed of every thread's sampler, for runs that must sample the
    /// same blocks each time (tests); absent: drawn from the clock.
    pub const SAMPLE_SEED: &str = "TRAPLINE_SAMPLE_SEED";
    /// `--sample`'s mean when none is given: about one stack per 512 KiB
    /// allocated, as tcmalloc's and jemalloc's heap profilers sample.
    pub const DEFAULT_SAMPLE_BYTES: u64 = 512 << 10;
    /// What the agent's own file name contains (to find it in `LD_PRELOAD`).
    pub const AGENT_FILE_STEM: &str = "libtrapline_agent";
    /// `trapline attach` only (a line of the options it hands the agent,
    /// not a variable): the directory of the control socket, the CLI's.
    pub const CONTROL_DIR: &str = "TRAPLINE_CONTROL_DIR";
    /// The agent's entry point `trapline attach` calls once it is loaded:
    /// `int trapline_attach(const char *options, char *error, size_t
    /// error_len)`, options as `NAME=value` lines; 0 when recording
    /// started, else -1 with the reason in `error`.
    pub const ATTACH_ENTRY: &str = "trapline_attach";

    /// Whether `path`, an entry of `LD_PRELOAD` (or the whole list), names
    /// the agent.
    pub fn names_agent(path: &[u8]) -> bool {
        let stem = AGENT_FILE_STEM.as_bytes();
        path.windows(stem.len()).any(|w| w == stem)
    }

    /// Whether the environment entry `entry` (`NAME=value`) sets `name`.
    pub fn sets(entry: &[u8], name: &str) -> bool {
        entry
            .strip_prefix(name.as_bytes())
            .is_some_and(|rest| rest.first() == Some(&b'='))
    }
}

/// The control socket: where a traced process's agent serves `trapline
/// watch`, and what it answers.
pub mod control {
    /// The directory of the sockets: `$XDG_RUNTIME_DIR/trapline` when that
    /// is an absolute path, else `/tmp/trapline-UID`. Only its owner may
    /// enter it (mode 0700), and the agent serves nothing from a directory
    /// of another owner or mode.
    pub fn socket_dir(xdg_runtime_dir: Option<&str>, uid: u32) -> String {
        match xdg_runtime_dir.filter(|d| d.starts_with('/')) {
            Some(d) => format!("{}/trapline", d.trim_end_matches('/')),
            None => format!("/tmp/trapline-{uid}"),
        }
    }

    /// The socket of process `pid` in `dir`.
    pub fn socket_path(dir: &str, pid: u32) -> String {
        format!("{dir}/{pid}.sock")
    }

    /// Removes the sockets in `dir` of the processes `gone` says no longer
    /// exist (killed before their agents could remove their own, or
    /// unable to: a worker that changed its user).
    pub fn remove_stale_sockets(dir: &str, gone: impl Fn(u32) -> bool) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_suffix(".sock"))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|&p| p > 0 && p <= i32::MAX as u32);
            if pid.is_some_and(&gone) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// A request, one line: the live blocks summed per allocation site.
    /// The answer, one line of JSON: `{"pid", "time_ns", "trace",
    /// "since_ns", "sites": [{"stack", "fn", "bytes", "blocks", "ages",
    /// "new_blocks", "new_bytes", "gone_blocks"}, ...]}`. `ages` counts the
    /// site's blocks by age, in the buckets [`AGE_BUCKETS_S`] bound; the
    /// `new_` and `gone_` counts are since this client's previous `sites`
    /// (`since_ns` before; blocks born and released between two requests
    /// are in neither).
    pub const SITES: &str = "sites";
    /// Upper bounds, in seconds, of the age buckets of `sites` (a last
    /// bucket holds the older blocks).
    pub const AGE_BUCKETS_S: [u64; 5] = [1, 10, 60, 600, 3600];
    /// A request: a reachability scan now, written to the trace as a
    /// periodic one. The answer: `{"pid", "time_ns", "scan", "blocks",
    /// "pause_ns", "lost": [[stack_id, "fn", bytes, blocks], ...]}` (the
    /// definitely and indirectly lost blocks per site), or an error
    /// (another scan under way, the process finishing, a scan skipped for
    /// lack of memory).
    pub const SCAN: &str = "scan";
    /// A request: the agent's counters. The answer: `{"pid", "time_ns",
    /// "events", "events_lost", "requests", "access_monitor", "faults",
    /// "fault_ns", "arms", "arm_ns", "armed_pages", "sweeps", "trace"}`;
    /// `access_monitor` is the mechanism in use (`userfaultfd`), `off`
    /// before the first `arm`, or why none can be used; `sweeps` counts the
    /// writer's periodic sweeps written (an event made before a sweep began
    /// is in `trace` once `sweeps` has gone past it).
    pub const COUNTERS: &str = "counters";
    /// A request: `blocks STACK FN N MIN_AGE_MS`, up to N of the site's
    /// live blocks at least MIN_AGE_MS old, spread over their ages (every
    /// k-th, oldest first). The answer:
    /// `{"blocks": [[addr, size, age_ms], ...]}`.
    pub const BLOCKS: &str = "blocks";
    /// A request: `arm HOT_AGE_MS ADDR...`, watch for the first access to
    /// the pages of these live blocks (at most [`PAGES_PER_BLOCK`] of
    /// each). A page is left out if it is not private anonymous memory,
    /// already watched, or holds a live block younger than HOT_AGE_MS or
    /// of a site none of the named blocks is of.
    /// The answer: `{"armed": [[addr, [page, ...]], ...], "refused": [[addr,
    /// "why"], ...]}`.
    pub const ARM: &str = "arm";
    /// At most this many pages of one block are watched (spread over it).
    pub const PAGES_PER_BLOCK: u64 = 8;
    /// A request: `disarm all`, or `disarm ADDR...` (the pages of these
    /// blocks): given back unaccessed. The answer: `{"disarmed": pages}`.
    pub const DISARM: &str = "disarm";
    /// A request: what became of the watched pages. The answer:
    /// `{"armed_pages", "watches": [[page, "outcome", armed_at_ns,
    /// ended_at_ns, tid], ...]}`, outcome one of `armed`, `touched`,
    /// `released` (given back unaccessed: a block on it was released, or
    /// the process forked), `interrupted` (an agent thread, a scan, read
    /// it). A watch that has ended is
    /// reported once.
    pub const WATCHES: &str = "watches";
    /// A request: `verdict STACK FN KINDS GROWTH_BPS WATCHED UNTOUCHED
    /// UNTOUCHED_MS LAST_ACCESS_NS`, a watcher's verdict on a site, written
    /// into the trace (`Event::SiteVerdict`) for the analyses to show
    /// offline. The answer: `{"written": true}`.
    pub const VERDICT: &str = "verdict";
    /// A request of a process `trapline attach` attached to: put back every
    /// import slot the agent changed, end the trace and go idle. The
    /// answer, once done: `{"detached": true, "slots": N}`.
    pub const DETACH: &str = "detach";
    /// Longest request line the agent reads; a longer one, or a line that
    /// is no request, is answered `{"error": "..."}`.
    pub const MAX_REQUEST: usize = 65536;
}

/// The trace files of a traced process tree: the top process writes TRACE;
/// every other process image writes TRACE.<pid>, then TRACE.<pid>.1,
/// TRACE.<pid>.2, ... (an exec'd image, a failed exec's continuation).
pub mod trace_names {
    /// The trace of generation `generation` of process `pid` under the top
    /// trace `top`: TRACE.<pid> for 0, TRACE.<pid>.<n> after.
    pub fn image_trace(top: &str, pid: u32, generation: u32) -> String {
        if generation == 0 {
            format!("{top}.{pid}")
        } else {
            format!("{top}.{pid}.{generation}")
        }
    }

    /// Whether a file named `name` belongs to the tree of the top trace named
    /// `top` (same directory): `top.<digits>[.<digits>...]`.
    pub fn is_member(top: &str, name: &str) -> bool {
        name.strip_prefix(top)
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|rest| {
                !rest.is_empty()
                    && rest
                        .split('.')
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            })
    }
}

/// Which programs the dynamic loader can preload the agent into, read
/// from their ELF headers through a caller's reader, without allocating.
pub mod elf {
    /// The PT_INTERP path of a program, in a fixed buffer.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct LoaderPath {
        bytes: [u8; 256],
        len: usize,
    }

    impl LoaderPath {
        pub fn as_bytes(&self) -> &[u8] {
            &self.bytes[..self.len]
        }

        /// Whether it is glibc's loader: `ld-linux*` or `ld64.so*` (musl's
        /// is `ld-musl-*.so.1`, Android's `linker64`).
        pub fn is_glibc(&self) -> bool {
            is_glibc_loader(self.as_bytes())
        }
    }

    impl core::fmt::Display for LoaderPath {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str(&String::from_utf8_lossy(self.as_bytes()))
        }
    }

    /// How a file starts as a program. The loader's path is kept inline:
    /// boxing it would allocate, which a vfork child must not.
    #[derive(Clone, Copy, PartialEq, Eq)]
    #[allow(clippy::large_enum_variant)]
    pub enum ProgramStart {
        /// Not an ELF file (a script, `#!`, is none: its interpreter is
        /// checked on its own), or one whose headers cannot be read.
        Unknown,
        /// ELF without PT_INTERP (static, or static-PIE): no loader reads
        /// `LD_PRELOAD`.
        Static,
        /// Started by the loader it names.
        Loader {
            path: LoaderPath,
            class64: bool,
            little_endian: bool,
            machine: u16,
        },
    }

    impl ProgramStart {
        /// Whether glibc's loader for an agent of ELF machine `machine`
        /// (64-bit, little-endian) preloads the agent into this program.
        /// A static or unknown file is no dynamic program at all: false.
        pub fn is_foreign_to(&self, agent_machine: u16) -> bool {
            match *self {
                ProgramStart::Loader {
                    path,
                    class64,
                    little_endian,
                    machine,
                } => !class64 || !little_endian || machine != agent_machine || !path.is_glibc(),
                _ => false,
            }
        }
    }

    /// Reads how the file starts; `read_at(offset, buf)` fills `buf` from
    /// the file at `offset` and says whether it could.
    pub fn program_start(read_at: &mut dyn FnMut(u64, &mut [u8]) -> bool) -> ProgramStart {
        let mut header = [0u8; 64];
        if !read_at(0, &mut header) || header[..4] != *b"\x7fELF" {
            return ProgramStart::Unknown;
        }
        let class64 = header[4] == 2;
        let little_endian = header[5] == 1;
        let u16_at = |b: &[u8], at: usize| {
            let v = [b[at], b[at + 1]];
            u64::from(if little_endian {
                u16::from_le_bytes(v)
            } else {
                u16::from_be_bytes(v)
            })
        };
        let u32_at = |b: &[u8], at: usize| {
            let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
            u64::from(if little_endian {
                u32::from_le_bytes(v)
            } else {
                u32::from_be_bytes(v)
            })
        };
        let u64_at = |b: &[u8], at: usize| {
            let (lo, hi) = (u32_at(b, at), u32_at(b, at + 4));
            if little_endian {
                lo | hi << 32
            } else {
                hi | lo << 32
            }
        };
        let machine = u16_at(&header, 18) as u16;
        let (phoff, phentsize, phnum) = if class64 {
            (
                u64_at(&header, 32),
                u16_at(&header, 54),
                u16_at(&header, 56),
            )
        } else {
            (
                u32_at(&header, 28),
                u16_at(&header, 42),
                u16_at(&header, 44),
            )
        };
        let min = if class64 { 56 } else { 32 };
        if phnum == 0 || phentsize < min || phentsize > 64 || phnum > 256 {
            return ProgramStart::Unknown;
        }
        for i in 0..phnum {
            let mut ph = [0u8; 64];
            if !read_at(phoff + i * phentsize, &mut ph[..phentsize as usize]) {
                return ProgramStart::Unknown;
            }
            const PT_INTERP: u64 = 3;
            if u32_at(&ph, 0) != PT_INTERP {
                continue;
            }
            let (offset, size) = if class64 {
                (u64_at(&ph, 8), u64_at(&ph, 32))
            } else {
                (u32_at(&ph, 4), u32_at(&ph, 16))
            };
            let mut path = LoaderPath {
                bytes: [0; 256],
                len: 0,
            };
            let size = (size as usize).min(path.bytes.len());
            if !read_at(offset, &mut path.bytes[..size]) {
                return ProgramStart::Unknown;
            }
            path.len = path.bytes[..size]
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(size);
            return ProgramStart::Loader {
                path,
                class64,
                little_endian,
                machine,
            };
        }
        ProgramStart::Static
    }

    /// Whether `loader` (a PT_INTERP path) is glibc's.
    pub fn is_glibc_loader(loader: &[u8]) -> bool {
        let name = loader.rsplit(|&b| b == b'/').next().unwrap_or(loader);
        name.starts_with(b"ld-linux") || name.starts_with(b"ld64.so") || name.starts_with(b"ld.so")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_entries() {
        assert!(env::sets(b"TRAPLINE_SCAN=0", env::SCAN));
        assert!(!env::sets(b"TRAPLINE_SCAN_EVERY=5", env::SCAN));
        assert!(!env::sets(b"TRAPLINE_SCAN", env::SCAN));
        assert!(env::names_agent(b"/opt/t/libtrapline_agent.so"));
        assert!(!env::names_agent(b"/usr/lib/libjemalloc.so.2"));
    }

    #[test]
    fn trace_names_of_a_tree() {
        assert_eq!(
            trace_names::image_trace("/t/x.trace", 42, 0),
            "/t/x.trace.42"
        );
        assert_eq!(
            trace_names::image_trace("/t/x.trace", 42, 3),
            "/t/x.trace.42.3"
        );
        assert!(trace_names::is_member("x.trace", "x.trace.42"));
        assert!(trace_names::is_member("x.trace", "x.trace.42.1"));
        assert!(!trace_names::is_member("x.trace", "x.trace"));
        assert!(!trace_names::is_member("x.trace", "x.trace.old"));
        assert!(!trace_names::is_member("x.trace", "x.trace.old.42"));
        assert!(!trace_names::is_member("x.trace", "x.trace.42."));
    }

    /// A minimal ELF64 header with one PT_INTERP program header naming `interp`.
    fn elf64(machine: u16, interp: Option<&[u8]>, big_endian: bool) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 56];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = if big_endian { 2 } else { 1 };
        let put16 = |f: &mut Vec<u8>, at: usize, v: u16| {
            let b = if big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            f[at..at + 2].copy_from_slice(&b);
        };
        let put32 = |f: &mut Vec<u8>, at: usize, v: u32| {
            let b = if big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            f[at..at + 4].copy_from_slice(&b);
        };
        let put64 = |f: &mut Vec<u8>, at: usize, v: u64| {
            let b = if big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            f[at..at + 8].copy_from_slice(&b);
        };
        put16(&mut f, 18, machine);
        put64(&mut f, 32, 64);
        put16(&mut f, 54, 56);
        put16(&mut f, 56, 1);
        if let Some(path) = interp {
            put32(&mut f, 64, 3);
            put64(&mut f, 64 + 8, 120);
            put64(&mut f, 64 + 32, path.len() as u64 + 1);
            f.extend_from_slice(path);
            f.push(0);
        } else {
            put32(&mut f, 64, 1);
        }
        f
    }

    fn start_of(file: &[u8]) -> elf::ProgramStart {
        elf::program_start(&mut |offset, buf| {
            let at = offset as usize;
            match file.get(at..at + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        })
    }

    #[test]
    fn which_programs_take_the_agent() {
        let glibc = elf64(62, Some(b"/lib64/ld-linux-x86-64.so.2"), false);
        let start = start_of(&glibc);
        assert!(!start.is_foreign_to(62));
        match start {
            elf::ProgramStart::Loader { path, .. } => {
                assert_eq!(path.as_bytes(), b"/lib64/ld-linux-x86-64.so.2");
                assert_eq!(path.to_string(), "/lib64/ld-linux-x86-64.so.2");
            }
            _ => panic!("a loader"),
        }
        assert!(start_of(&elf64(62, Some(b"/lib/ld-musl-x86_64.so.1"), false)).is_foreign_to(62));
        assert!(
            start_of(&elf64(183, Some(b"/lib/ld-linux-aarch64.so.1"), false)).is_foreign_to(62)
        );
        assert!(start_of(&elf64(62, Some(b"/lib64/ld-linux-x86-64.so.2"), true)).is_foreign_to(62));
        let static_one = start_of(&elf64(62, None, false));
        assert!(static_one == elf::ProgramStart::Static);
        assert!(!static_one.is_foreign_to(62));
        assert!(start_of(b"#!/bin/sh\n") == elf::ProgramStart::Unknown);
        assert!(start_of(&glibc[..70]) == elf::ProgramStart::Unknown);
    }
}
