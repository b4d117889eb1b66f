//! Module handling: stripped files, separate debug files, missing or replaced
//! files, corrupt input, caching and module lifetimes.

mod common;

use common::{function, module_info, outside, symbolizer_for, Program};
use trapline_symbols::{CacheStats, Frame, Symbolizer};
use trapline_trace::{ModuleInfo, Segment};

const SOURCE: &str = r#"#include <stdlib.h>

static volatile int counter;

__attribute__((noinline)) void *sink(size_t n) {
    return malloc(n);
}

static __attribute__((noinline)) void *inner(size_t n) {
    return malloc(n + 1);
}

static __attribute__((noinline)) void *hidden(size_t n) {
    return inner(n); /* CALL_HIDDEN */
}

void *leak_here(size_t n) {
    counter++;
    sink(n); /* CALL_LEAK */
    counter++;
    return hidden(n);
}

int main(void) {
    leak_here(16); /* CALL_MAIN */
    return 0;
}
"#;

/// Builds `SOURCE` as `leak` with the gcc `flags`.
fn build(test: &str, flags: &[&str]) -> Program {
    let mut command = vec!["gcc", "-g", "-O0", "-o", "leak", "leak.c"];
    command.extend_from_slice(flags);
    Program::build(test, "leak.c", SOURCE, "leak", &command)
}

/// A frame in a module that has no file to read.
fn in_missing_module(address: u64, path: &str) -> Frame {
    Frame {
        module: Some(path.to_owned()),
        ..outside(address)
    }
}

#[test]
fn without_dwarf_names_come_from_the_symbol_table() {
    let program = build("strip-debug", &[]);
    let ret = program.call("leak_here", "sink");
    let hidden_ret = program.call("hidden", "inner");
    program.run("strip", &["--strip-debug", "leak"]);

    let mut symbolizer = program.symbolizer();
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![program.named(ret, "leak_here")]
    );
    assert_eq!(
        symbolizer.symbolize(hidden_ret),
        vec![program.named(hidden_ret, "hidden")]
    );
    assert!(
        symbolizer.warnings().is_empty(),
        "{:?}",
        symbolizer.warnings()
    );
}

#[test]
fn fully_stripped_library_uses_dynsym() {
    let program = Program::build(
        "strip-all",
        "leak.c",
        SOURCE,
        "libleak.so",
        &[
            "gcc",
            "-g",
            "-O0",
            "-shared",
            "-fPIC",
            "-o",
            "libleak.so",
            "leak.c",
        ],
    );
    let ret = program.call("leak_here", "hidden");
    let hidden_ret = program.call("hidden", "inner");
    program.run("strip", &["--strip-all", "libleak.so"]);

    let mut symbolizer = program.symbolizer();
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![program.named(ret, "leak_here")]
    );
    // A static function is not exported: no name rather than a neighbour's.
    assert_eq!(
        symbolizer.symbolize(hidden_ret),
        vec![program.unknown(hidden_ret)]
    );
}

/// Moves the debug info of the program into `debug` and strips everything else.
fn split_debug(program: &Program, debug: &str) {
    program.run("objcopy", &["--only-keep-debug", "leak", debug]);
    program.run("strip", &["--strip-all", "leak"]);
}

#[test]
fn separate_debug_file_by_build_id() {
    let program = build("build-id", &[]);
    let ret = program.call("leak_here", "sink");
    let hidden_ret = program.call("hidden", "inner");
    let info = program.info();
    split_debug(&program, "leak.debug");

    // Stripped, and no debug directory has it.
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![program.unknown(ret)]
    );

    let id: String = info.build_id.iter().map(|b| format!("{b:02x}")).collect();
    let debug_dir = program.dir.join("debug");
    let by_id = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&by_id).unwrap();
    let debug_file = by_id.join(format!("{}.debug", &id[2..]));
    std::fs::rename(program.dir.join("leak.debug"), debug_file).unwrap();

    let mut symbolizer = Symbolizer::new();
    symbolizer.set_debug_dirs(vec![program.dir.join("elsewhere"), debug_dir]);
    symbolizer.add_module(&info);
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
    assert_eq!(
        symbolizer.symbolize(hidden_ret),
        vec![program.at(hidden_ret, "hidden", "CALL_HIDDEN", false)]
    );
    assert!(
        symbolizer.warnings().is_empty(),
        "{:?}",
        symbolizer.warnings()
    );
}

#[test]
fn separate_debug_file_by_debuglink() {
    let program = build("debuglink", &[]);
    let ret = program.call("leak_here", "sink");
    split_debug(&program, "leak.dbg");
    program.run("objcopy", &["--add-gnu-debuglink=leak.dbg", "leak"]);
    let expected = vec![program.at(ret, "leak_here", "CALL_LEAK", false)];

    // Next to the module.
    assert_eq!(program.symbolizer().symbolize(ret), expected);

    // In the module's .debug directory.
    let moved = program.dir.join(".debug/leak.dbg");
    std::fs::create_dir(program.dir.join(".debug")).unwrap();
    std::fs::rename(program.dir.join("leak.dbg"), &moved).unwrap();
    assert_eq!(program.symbolizer().symbolize(ret), expected);

    // A debug file whose CRC does not match the link is another build's.
    let mut data = std::fs::read(&moved).unwrap();
    data.push(0);
    std::fs::write(&moved, data).unwrap();
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![program.unknown(ret)]
    );
}

#[test]
fn missing_file_gives_unknown_function_and_one_warning() {
    let path = "/nonexistent/trapline/libgone.so";
    let info = ModuleInfo {
        id: 7,
        path: path.to_owned(),
        build_id: vec![1, 2, 3, 4],
        bias: 0x7f00_0000_0000,
        segments: vec![Segment {
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_5000,
            flags: 5,
        }],
    };
    let mut symbolizer = symbolizer_for(&info);
    for address in [0x7f00_0000_1234, 0x7f00_0000_2345] {
        assert_eq!(
            symbolizer.symbolize(address),
            vec![in_missing_module(address, path)]
        );
    }
    let warnings = symbolizer.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains(path), "{warnings:?}");
    assert!(warnings[0].contains("cannot read"), "{warnings:?}");
}

#[test]
fn other_build_id_gives_unknown_function_and_a_warning() {
    let program = build("rebuilt", &[]);
    let ret = program.call("leak_here", "sink");
    let mut info = program.info();
    info.build_id[0] ^= 0xff;

    let mut symbolizer = symbolizer_for(&info);
    assert_eq!(symbolizer.symbolize(ret), vec![program.unknown(ret)]);
    let warnings = symbolizer.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("build id"), "{warnings:?}");
    assert!(
        warnings[0].contains(program.exe.to_str().unwrap()),
        "{warnings:?}"
    );

    // An empty build id in the trace means "not checked".
    info.build_id.clear();
    let mut symbolizer = symbolizer_for(&info);
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
}

#[test]
fn addresses_outside_modules() {
    let program = build("outside", &[]);
    let mut symbolizer = symbolizer_for(&common::module_info_with_bias(
        1,
        &program.exe,
        0x5555_0000_0000,
    ));
    for address in [0, 1, 0x1000, u64::MAX] {
        assert_eq!(symbolizer.symbolize(address), vec![outside(address)]);
    }
    // No module file needed reading for these.
    assert_eq!(symbolizer.cache_stats().files_loaded, 0);
}

#[test]
fn vdso_is_unknown_without_warning() {
    let info = ModuleInfo {
        id: 3,
        path: "linux-vdso.so.1".to_owned(),
        build_id: Vec::new(),
        bias: 0x7fff_0000_0000,
        segments: vec![Segment {
            start: 0x7fff_0000_0000,
            end: 0x7fff_0000_2000,
            flags: 5,
        }],
    };
    let mut symbolizer = symbolizer_for(&info);
    let address = 0x7fff_0000_0100;
    assert_eq!(
        symbolizer.symbolize(address),
        vec![in_missing_module(address, "linux-vdso.so.1")]
    );
    assert!(symbolizer.warnings().is_empty());
}

#[test]
fn caches_addresses_and_loads_lazily() {
    let program = build("cache", &[]);
    let ret = program.call("leak_here", "sink");
    let main_ret = program.call("main", "leak_here");

    let mut symbolizer = program.symbolizer();
    assert_eq!(symbolizer.cache_stats(), CacheStats::default());
    let first = symbolizer.symbolize(ret);
    assert_eq!(
        first,
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
    assert_eq!(symbolizer.symbolize(ret), first);
    symbolizer.symbolize(main_ret);
    assert_eq!(
        symbolizer.cache_stats(),
        CacheStats {
            lookups: 3,
            hits: 1,
            files_loaded: 1
        }
    );

    // The same file registered again (a library loaded twice) is not re-read.
    let shift = 0x1000_0000;
    let again = common::module_info_with_bias(2, &program.exe, shift);
    symbolizer.add_module(&again);
    assert_eq!(
        symbolizer.symbolize(ret + shift),
        vec![program.at(ret + shift, "leak_here", "CALL_LEAK", false)]
    );
    assert_eq!(symbolizer.cache_stats().files_loaded, 1);
}

#[test]
fn symbolize_stack_flattens_in_order() {
    let program = build("stack", &[]);
    let ret = program.call("leak_here", "sink");
    let main_ret = program.call("main", "leak_here");
    let far = 0x7000_0000_0000;

    let mut symbolizer = program.symbolizer();
    let expected = vec![
        program.at(ret, "leak_here", "CALL_LEAK", false),
        program.at(main_ret, "main", "CALL_MAIN", false),
        outside(far),
    ];
    assert_eq!(symbolizer.symbolize_stack(&[ret, main_ret, far]), expected);
    assert_eq!(symbolizer.symbolize_ref(ret), &expected[..1]);
}

#[test]
fn removed_and_replaced_modules() {
    let program = build("unload", &[]);
    let ret = program.call("leak_here", "sink");
    let info = program.info();
    let expected = vec![program.at(ret, "leak_here", "CALL_LEAK", false)];

    let mut symbolizer = program.symbolizer();
    assert_eq!(symbolizer.symbolize(ret), expected);
    assert!(symbolizer.remove_module(1));
    assert!(!symbolizer.remove_module(1));
    // The cached answer went with the module.
    assert_eq!(symbolizer.symbolize(ret), vec![outside(ret)]);

    // A later module at the same addresses takes them over.
    symbolizer.add_module(&info);
    assert_eq!(symbolizer.symbolize(ret), expected);
    let other = ModuleInfo {
        id: 2,
        path: "/nonexistent/other".to_owned(),
        ..info
    };
    symbolizer.add_module(&other);
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![in_missing_module(ret, "/nonexistent/other")]
    );
}

#[test]
fn corrupt_files_never_panic() {
    let program = build("corrupt", &[]);
    let ret = program.call("leak_here", "sink");
    let (leak_start, _) = function(&program.exe, "leak_here");
    let original = std::fs::read(&program.exe).unwrap();
    let target = program.dir.join("mutant");
    let info = ModuleInfo {
        path: target.to_str().unwrap().to_owned(),
        // Corrupted files have other build ids; skip the check to reach the parsers.
        build_id: Vec::new(),
        ..module_info(1, &program.exe)
    };
    let addresses = [ret, leak_start + 1, leak_start + 3, 0x401000, 0x1001];
    // Garbage, empty, and truncated files.
    let mut variants: Vec<Vec<u8>> = vec![Vec::new(), b"\x7fELF garbage".to_vec()];
    for cut in [
        16,
        64,
        200,
        original.len() / 3,
        original.len() / 2,
        original.len() - 1,
    ] {
        variants.push(original[..cut].to_vec());
    }
    // Random byte flips, deterministic (a small LCG).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    // Anywhere, then inside the DWARF sections, where the parsers are deepest.
    let mut ranges = vec![(0, original.len())];
    ranges.extend(debug_section_ranges(&original));
    let rounds: usize = std::env::var("TRAPLINE_FUZZ_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    for &(start, len) in &ranges {
        for _ in 0..rounds {
            let mut data = original.clone();
            let flips = 1 + next() % 16;
            for _ in 0..flips {
                let at = start + (next() as usize) % len;
                data[at] = next() as u8;
            }
            variants.push(data);
        }
    }

    for data in variants {
        std::fs::write(&target, &data).unwrap();
        let mut symbolizer = symbolizer_for(&info);
        for &address in &addresses {
            let frames = symbolizer.symbolize(address);
            assert!(!frames.is_empty());
            assert!(frames.iter().all(|f| f.address == address));
        }
    }
}

/// File ranges of the `.debug_*` sections.
fn debug_section_ranges(data: &[u8]) -> Vec<(usize, usize)> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(data).unwrap();
    let ranges: Vec<(usize, usize)> = file
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .filter_map(|s| s.file_range())
        .filter(|&(_, len)| len > 0)
        .map(|(start, len)| (start as usize, len as usize))
        .collect();
    assert!(ranges.len() >= 4, "{ranges:?}");
    ranges
}

#[test]
fn symbolizer_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Symbolizer>();
}

#[test]
fn overlapping_modules_warn_once_unless_they_are_the_same_file() {
    let lib = |id, path: &str| ModuleInfo {
        id,
        path: path.to_owned(),
        build_id: vec![],
        bias: 0x7f00_0000_0000,
        segments: vec![Segment {
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_5000,
            flags: 5,
        }],
    };
    let overlaps = |s: &Symbolizer| {
        s.warnings()
            .into_iter()
            .filter(|w| w.contains("was mapped where"))
            .count()
    };
    // The same library unloaded and loaded again at the same place: the
    // answers cannot differ, nothing to say.
    let mut symbolizer = Symbolizer::new();
    symbolizer.add_module(&lib(1, "/nonexistent/liba.so"));
    symbolizer.add_module(&lib(2, "/nonexistent/liba.so"));
    symbolizer.symbolize(0x7f00_0000_1234);
    assert_eq!(overlaps(&symbolizer), 0);

    // Another library in its place: the latest wins, with one warning.
    symbolizer.add_module(&lib(3, "/nonexistent/libb.so"));
    for address in [0x7f00_0000_2234, 0x7f00_0000_3234] {
        assert_eq!(
            symbolizer.symbolize(address),
            vec![in_missing_module(address, "/nonexistent/libb.so")]
        );
    }
    // libb hides both registrations of liba: one line for the pair of files.
    assert_eq!(overlaps(&symbolizer), 1, "{:?}", symbolizer.warnings());
}
