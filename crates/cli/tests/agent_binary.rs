//! The agent library itself, read from disk: what its exported hooks look
//! like to an unwinder.

mod common;

use common::agent;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    X86_64,
};
use object::{Object, ObjectSection, ObjectSymbol};

/// The allocation and lock hooks are trampolines (arch::with_caller_regs,
/// arch::with_return_address) that jump to their bodies without a frame.
/// A signal can still land on one of their instructions (the CPU profiler's
/// sampling signal, a debugger's), so each carries the unwind entry every
/// x86_64 function starts with, valid on every byte: CFA = rsp + 8, the
/// return address at CFA - 8. Without it an unwinder finds no entry there
/// and the sample's stack ends at the hook.
#[test]
fn every_trampoline_unwinds_like_a_function_entry() {
    let hooks = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "_Znwm",
        "_ZnwmSt11align_val_tRKSt9nothrow_t",
        "_ZdlPv",
        "_ZdaPvmSt11align_val_t",
        "pthread_mutex_lock",
        "pthread_mutex_unlock",
    ];
    for (name, rows) in unwind_rows(&hooks) {
        assert!(
            rows.len() >= 10,
            "{name}'s entry covers {} bytes",
            rows.len()
        );
        for (at, (cfa, ra)) in rows.iter().enumerate() {
            assert_eq!(
                cfa,
                &CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset: 8
                },
                "{name}+{at}"
            );
            assert_eq!(ra, &Some(RegisterRule::Offset(-8)), "{name}+{at}");
        }
    }
}

/// The exit and variadic exec hooks (naked stubs that spill registers into
/// 56 bytes of stack and call a collector) carry CFI on every byte: CFA =
/// rsp + 8 before the spill area is made (and after it is released), rsp +
/// 64 while it exists, the return address at CFA - 8. Without it gdb's
/// backtrace from an atexit handler went astray past exit.
#[test]
fn the_exit_and_exec_stubs_unwind_into_their_caller() {
    for (name, rows) in unwind_rows(&["exit", "execl", "execle", "execlp"]) {
        let mut offsets = Vec::new();
        for (at, (cfa, ra)) in rows.iter().enumerate() {
            let CfaRule::RegisterAndOffset { register, offset } = *cfa else {
                panic!("{name}+{at}: CFA is an expression");
            };
            assert_eq!(register, X86_64::RSP, "{name}+{at}");
            assert_eq!(ra, &Some(RegisterRule::Offset(-8)), "{name}+{at}");
            offsets.push(offset);
        }
        assert_eq!(offsets[0], 8, "{name} at entry");
        assert!(offsets.contains(&64), "{name}: no row with its spill area");
        assert!(
            offsets.iter().all(|&o| o == 8 || o == 64),
            "{name}: CFA offsets {offsets:?}"
        );
    }
}

type Row = (CfaRule<usize>, Option<RegisterRule<usize>>);

/// For each exported function of the agent named in `names`: the CFA rule
/// and the return address's rule at each byte its unwind entry covers,
/// which must start at the symbol.
fn unwind_rows<'a>(names: &[&'a str]) -> Vec<(&'a str, Vec<Row>)> {
    let data = std::fs::read(agent()).expect("read the agent");
    let file = object::File::parse(&*data).expect("parse the agent");
    let section = file.section_by_name(".eh_frame").expect(".eh_frame");
    let eh_frame = EhFrame::new(section.data().expect(".eh_frame data"), LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut context = UnwindContext::new();
    names
        .iter()
        .map(|&name| {
            let symbol = file
                .dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .unwrap_or_else(|| panic!("the agent exports no {name}"));
            let start = symbol.address();
            let fde = eh_frame
                .fde_for_address(&bases, start, EhFrame::cie_from_offset)
                .unwrap_or_else(|e| panic!("no unwind entry for {name} at {start:#x}: {e}"));
            assert_eq!(
                fde.initial_address(),
                start,
                "{name}'s entry starts elsewhere"
            );
            let rows = (start..start + fde.len())
                .map(|address| {
                    let row = fde
                        .unwind_info_for_address(&eh_frame, &bases, &mut context, address)
                        .unwrap_or_else(|e| panic!("{name}+{}: {e}", address - start));
                    (row.cfa().clone(), row.register(X86_64::RA))
                })
                .collect();
            (name, rows)
        })
        .collect()
}
