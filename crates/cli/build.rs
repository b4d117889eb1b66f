//! Links `csrc/inherited_sigpipe.c` into the `trapline` binary: a C
//! constructor that notes how SIGPIPE was inherited before Rust's runtime
//! changes it (the file says why). Linked as an object of its own, since
//! nothing refers to it and a static library's unreferenced object would be
//! left out.

fn main() {
    let source = "csrc/inherited_sigpipe.c";
    println!("cargo:rerun-if-changed={source}");
    let objects = cc::Build::new()
        .file(source)
        .warnings(true)
        .cargo_metadata(false)
        .compile_intermediates();
    for object in objects {
        println!("cargo:rustc-link-arg-bins={}", object.display());
    }
}
