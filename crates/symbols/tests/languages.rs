//! Symbolizing C, C++ and Rust programs compiled with debug info.

mod common;

use common::{module_info_with_bias, outside, Program};

const C_SOURCE: &str = r#"#include <stdlib.h>

static volatile int counter;

__attribute__((noinline)) void *sink(size_t n) {
    return malloc(n);
}

void *leak_here(size_t n) {
    counter++;
    sink(n); /* CALL_LEAK */
    counter++; /* AFTER_LEAK */
    return 0;
}

int main(void) {
    leak_here(16); /* CALL_MAIN */
    return 0;
}
"#;

/// Builds `C_SOURCE` as `dir/leak` with the gcc `flags`.
fn build_c(test: &str, flags: &[&str]) -> Program {
    let mut command = vec!["gcc", "-g", "-O0", "-o", "leak", "leak.c"];
    command.extend_from_slice(flags);
    Program::build(test, "leak.c", C_SOURCE, "leak", &command)
}

#[test]
fn c_function_file_and_line_of_the_call() {
    let program = build_c("c", &[]);
    let ret = program.call("leak_here", "sink");
    let main_ret = program.call("main", "leak_here");

    let mut symbolizer = program.symbolizer();
    assert_eq!(
        symbolizer.symbolize(ret),
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
    assert_eq!(
        symbolizer.symbolize(main_ret),
        vec![program.at(main_ret, "main", "CALL_MAIN", false)]
    );
    // The return address itself is on the next line: the rule above is what
    // moved the answer to the call's line.
    assert_eq!(
        symbolizer.symbolize(ret + 1),
        vec![program.at(ret + 1, "leak_here", "AFTER_LEAK", false)]
    );
    assert!(
        symbolizer.warnings().is_empty(),
        "{:?}",
        symbolizer.warnings()
    );
}

#[test]
fn source_given_by_absolute_path() {
    let dir = common::Workdir::new("c-absolute");
    let source = dir.write("leak.c", C_SOURCE);
    let exe = dir.join("leak");
    common::run(
        &dir.path,
        "gcc",
        &[
            "-g",
            "-O0",
            "-o",
            exe.to_str().unwrap(),
            source.to_str().unwrap(),
        ],
    );
    let program = Program {
        dir,
        text: C_SOURCE,
        source,
        exe,
    };
    let ret = program.call("leak_here", "sink");
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
}

#[test]
fn pie_loaded_at_a_bias() {
    // Relative source path: the file comes out joined to the compilation directory.
    let program = build_c("c-pie", &["-fPIE", "-pie"]);
    let ret = program.call("leak_here", "sink");
    let bias = 0x5555_5555_4000;

    let mut symbolizer = common::symbolizer_for(&module_info_with_bias(1, &program.exe, bias));
    assert_eq!(
        symbolizer.symbolize(ret + bias),
        vec![program.at(ret + bias, "leak_here", "CALL_LEAK", false)]
    );
    // The unbiased file address is not in the process's address space.
    assert_eq!(symbolizer.symbolize(ret), vec![outside(ret)]);
}

#[test]
fn compressed_debug_sections() {
    let program = build_c("c-gz", &["-gz"]);
    let ret = program.call("leak_here", "sink");
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![program.at(ret, "leak_here", "CALL_LEAK", false)]
    );
}

const INLINE_SOURCE: &str = r#"__attribute__((noinline, noipa)) int sink(int n) {
    return n * 3;
}

static inline __attribute__((always_inline)) int helper(int x) {
    int r = sink(x); /* CALL_SINK */
    return r + 1;
}

__attribute__((noinline)) int outer(int x) {
    int y = helper(x); /* CALL_HELPER */
    return y * 2;
}

int main(int argc, char **argv) {
    (void)argv;
    return outer(argc);
}
"#;

#[test]
fn c_inlined_function_gives_two_frames() {
    let program = Program::build(
        "c-inline",
        "inline.c",
        INLINE_SOURCE,
        "inline",
        &["gcc", "-g", "-O2", "-o", "inline", "inline.c"],
    );
    let ret = program.call("outer", "sink");
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![
            program.at(ret, "helper", "CALL_SINK", true),
            program.at(ret, "outer", "CALL_HELPER", false),
        ]
    );
}

#[test]
fn split_dwarf_dwo_files() {
    let program = Program::build(
        "c-dwo",
        "inline.c",
        INLINE_SOURCE,
        "inline.o",
        &[
            "gcc",
            "-g",
            "-gsplit-dwarf",
            "-O2",
            "-c",
            "inline.c",
            "-o",
            "inline.o",
        ],
    );
    program.run("gcc", &["-o", "inline", "inline.o"]);
    let program = Program {
        exe: program.dir.join("inline"),
        ..program
    };
    assert!(program.dir.join("inline.dwo").exists());
    let ret = program.call("outer", "sink");
    assert_eq!(
        program.symbolizer().symbolize(ret),
        vec![
            program.at(ret, "helper", "CALL_SINK", true),
            program.at(ret, "outer", "CALL_HELPER", false),
        ]
    );

    // Without the .dwo the skeleton's line table remains, but the functions
    // and inlining are gone: the name comes from the symbol table.
    std::fs::remove_file(program.dir.join("inline.dwo")).unwrap();
    let frames = program.symbolizer().symbolize(ret);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].function.as_deref(), Some("outer"));
}

const CPP_SOURCE: &str = r#"#include <cstdlib>

namespace ns {

__attribute__((noinline)) void *sink(std::size_t n) {
    return std::malloc(n);
}

struct Widget {
    int value;
    static Widget *make(int v);
};

Widget *Widget::make(int v) {
    sink(sizeof(Widget)); // CALL_MAKE
    return new Widget{v};
}

template <typename T> T twice(T x) {
    sink(sizeof(T)); // CALL_TWICE
    return x + x;
}

} // namespace ns

int main() {
    ns::Widget::make(3);
    return ns::twice<long>(2) == 4 ? 0 : 1;
}
"#;

#[test]
fn cpp_names_are_demangled() {
    let program = Program::build(
        "cpp",
        "widget.cpp",
        CPP_SOURCE,
        "widget",
        &["g++", "-g", "-O0", "-o", "widget", "widget.cpp"],
    );
    let make = program.call("ns::Widget::make(int)", "ns::sink(unsigned long)");
    let twice = program.call("long ns::twice<long>(long)", "ns::sink(unsigned long)");

    let mut symbolizer = program.symbolizer();
    assert_eq!(
        symbolizer.symbolize(make),
        vec![program.at(make, "ns::Widget::make(int)", "CALL_MAKE", false)]
    );
    assert_eq!(
        symbolizer.symbolize(twice),
        vec![program.at(twice, "long ns::twice<long>(long)", "CALL_TWICE", false)]
    );
}

const RUST_SOURCE: &str = r#"mod module {
    #[inline(never)]
    pub fn function(n: usize) -> usize {
        let v = super::sink(n); // CALL_FUNCTION
        v + 1
    }

    pub struct Holder(pub usize);

    impl Holder {
        #[inline(never)]
        pub fn method(&self) -> usize {
            super::sink(self.0) // CALL_METHOD
        }
    }
}

#[inline(never)]
fn sink(n: usize) -> usize {
    std::hint::black_box(n) * 2
}

fn main() {
    let a = module::function(3);
    let b = module::Holder(a).method();
    std::process::exit(if b == 14 { 0 } else { 1 });
}
"#;

/// Compiles the Rust program with extra `flags` and checks two frames;
/// `method` is how the mangling scheme spells the method's path.
fn check_rust(test: &str, flags: &[&str], method: &str) {
    let mut command = vec![
        "rustc",
        "-g",
        "-C",
        "opt-level=0",
        "--crate-name",
        "tracee",
        "main.rs",
    ];
    command.extend_from_slice(flags);
    let program = Program::build(test, "main.rs", RUST_SOURCE, "tracee", &command);
    let function_ret = program.call("tracee::module::function", "tracee::sink");
    let method_ret = program.call(method, "tracee::sink");

    let mut symbolizer = program.symbolizer();
    assert_eq!(
        symbolizer.symbolize(function_ret),
        vec![program.at(
            function_ret,
            "tracee::module::function",
            "CALL_FUNCTION",
            false
        )]
    );
    assert_eq!(
        symbolizer.symbolize(method_ret),
        vec![program.at(method_ret, method, "CALL_METHOD", false)]
    );
}

#[test]
fn rust_legacy_names_are_demangled_without_hash() {
    // Legacy mangling is rustc's default.
    check_rust("rust-legacy", &[], "tracee::module::Holder::method");
}

#[test]
fn rust_v0_names_are_demangled() {
    check_rust(
        "rust-v0",
        &["-C", "symbol-mangling-version=v0"],
        "<tracee::module::Holder>::method",
    );
}
