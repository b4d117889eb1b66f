//! Helpers shared by the integration tests: compiling small programs into a
//! temporary directory and finding addresses in them.

#![allow(dead_code)] // Each test file uses a different subset.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use trapline_symbols::{Frame, Symbolizer};
use trapline_trace::{ModuleInfo, Segment};

/// A fresh directory under the system temp dir, removed on drop.
pub struct Workdir {
    pub path: PathBuf,
}

impl Workdir {
    pub fn new(name: &str) -> Workdir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let unique = format!(
            "trapline-symbols-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path).unwrap();
        // DWARF records the canonical working directory.
        let path = path.canonicalize().unwrap();
        Workdir { path }
    }

    /// Writes `text` to `name` and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Runs a tool in `dir`, failing the test with its output if it fails.
pub fn run(dir: &Path, program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The 1-based line of the only line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "marker {marker} must be on exactly one line"
    );
    lines[0] as u32
}

/// A module as the agent would record it, with bias 0: symbolizing file
/// virtual addresses directly.
pub fn module_info(id: u32, path: &Path) -> ModuleInfo {
    module_info_with_bias(id, path, 0)
}

/// A module loaded at `bias`.
pub fn module_info_with_bias(id: u32, path: &Path, bias: u64) -> ModuleInfo {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let build_id = file
        .build_id()
        .unwrap()
        .expect("test binaries have a build id")
        .to_vec();
    let segments = file
        .segments()
        .map(|s| Segment {
            start: s.address() + bias,
            end: s.address() + s.size() + bias,
            flags: 0,
        })
        .collect();
    ModuleInfo {
        id,
        path: path.to_str().unwrap().to_owned(),
        build_id,
        bias,
        segments,
    }
}

/// Address and size of the function symbol whose demangled name (without a
/// Rust hash) is `name`.
pub fn function(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let found: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition())
        .filter(|s| {
            let raw = s.name().unwrap_or("");
            addr2line::demangle_auto(raw.into(), None) == name
        })
        .map(|s| (s.address(), s.size()))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "function {name} in {}: {found:x?}",
        path.display()
    );
    found[0]
}

/// The return addresses of the direct (`call rel32`) calls from function
/// `caller` to function `callee`: the addresses that end up in stacks.
pub fn calls(path: &Path, caller: &str, callee: &str) -> Vec<u64> {
    let (start, size) = function(path, caller);
    let (target, _) = function(path, callee);
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let section = file
        .sections()
        .find(|s| s.address() <= start && start < s.address() + s.size())
        .expect("function in a section");
    let bytes = section.data().unwrap();
    let code = &bytes[(start - section.address()) as usize..][..size as usize];
    let mut found = Vec::new();
    for i in 0..code.len().saturating_sub(4) {
        if code[i] != 0xe8 {
            continue;
        }
        let rel = i32::from_le_bytes(code[i + 1..i + 5].try_into().unwrap());
        let next = start + i as u64 + 5;
        if next.wrapping_add(rel as i64 as u64) == target {
            found.push(next);
        }
    }
    found
}

/// The single call from `caller` to `callee`.
pub fn call(path: &Path, caller: &str, callee: &str) -> u64 {
    let found = calls(path, caller, callee);
    assert_eq!(
        found.len(),
        1,
        "calls from {caller} to {callee}: {found:x?}"
    );
    found[0]
}

/// A program compiled from one source file into its own directory.
pub struct Program {
    pub dir: Workdir,
    /// The source text, for finding lines by marker.
    pub text: &'static str,
    pub source: PathBuf,
    pub exe: PathBuf,
}

impl Program {
    /// Writes `text` to `source_name` in a fresh directory and runs `command`
    /// (program and arguments) there, which must produce `exe_name`.
    pub fn build(
        test: &str,
        source_name: &str,
        text: &'static str,
        exe_name: &str,
        command: &[&str],
    ) -> Program {
        let dir = Workdir::new(test);
        let source = dir.write(source_name, text);
        run(&dir.path, command[0], &command[1..]);
        let exe = dir.join(exe_name);
        Program {
            dir,
            text,
            source,
            exe,
        }
    }

    /// Runs another tool in the program's directory.
    pub fn run(&self, program: &str, args: &[&str]) {
        run(&self.dir.path, program, args);
    }

    /// The module as recorded at bias 0.
    pub fn info(&self) -> ModuleInfo {
        module_info(1, &self.exe)
    }

    /// A symbolizer knowing only this program, and no system debug files.
    pub fn symbolizer(&self) -> Symbolizer {
        symbolizer_for(&self.info())
    }

    /// The return address of the single direct call from `caller` to `callee`.
    pub fn call(&self, caller: &str, callee: &str) -> u64 {
        call(&self.exe, caller, callee)
    }

    fn module(&self) -> Option<String> {
        Some(self.exe.to_str().unwrap().to_owned())
    }

    /// A frame with everything known: the line is the one holding `marker`.
    pub fn at(&self, address: u64, function: &str, marker: &str, inlined: bool) -> Frame {
        Frame {
            address,
            function: Some(function.to_owned()),
            file: Some(self.source.to_str().unwrap().to_owned()),
            line: Some(line_of(self.text, marker)),
            inlined,
            module: self.module(),
            allocation_wrapper: false,
        }
    }

    /// A frame named from a symbol table, without file and line.
    pub fn named(&self, address: u64, function: &str) -> Frame {
        Frame {
            function: Some(function.to_owned()),
            ..self.unknown(address)
        }
    }

    /// A frame in this program about which nothing is known.
    pub fn unknown(&self, address: u64) -> Frame {
        Frame {
            module: self.module(),
            ..outside(address)
        }
    }
}

/// A frame outside every module.
pub fn outside(address: u64) -> Frame {
    Frame::unknown(address)
}

/// A symbolizer with one module, and no system debug files (the tests must
/// not depend on what the machine has installed).
pub fn symbolizer_for(info: &ModuleInfo) -> Symbolizer {
    let mut symbolizer = Symbolizer::new();
    symbolizer.set_debug_dirs(Vec::new());
    symbolizer.add_module(info);
    symbolizer
}
