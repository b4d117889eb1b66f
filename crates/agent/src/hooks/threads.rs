//! pthread_create: the creator records `ThreadCreate`, and the new thread runs
//! a wrapper that records `ThreadStart` before the program's start routine.

use crate::events::thread::Provision;
use crate::events::threads;
use crate::platform::arch::start_regs;
use core::ffi::c_void;

use crate::platform::sys::{real_pthread_create, StartRoutine};

/// Resolves the real function (from the constructor, while dlsym is safe).
pub fn resolve() {
    real_pthread_create();
}

/// What the wrapper needs in the new thread; lives in the agent's heap.
struct Start {
    routine: StartRoutine,
    arg: *mut c_void,
    parent_tid: u32,
    create_id: u64,
    provision: Provision,
    /// Where `arg` is held as a root until `routine` has it.
    held: Option<usize>,
}

extern "C" fn thread_main(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box leaked by pthread_create below, handed to exactly this thread.
    let start = unsafe { Box::from_raw(p.cast::<Start>()) };
    let Start {
        routine,
        arg,
        parent_tid,
        create_id,
        provision,
        held,
    } = *start;
    threads::on_thread_begin(
        parent_tid,
        create_id,
        provision,
        crate::services::process_end::program_thread_started,
    );
    crate::services::profile::thread_begin();
    // From here `arg` is in this thread's registers and stack.
    threads::starting_args::release(held);
    routine(arg)
}

/// # Safety
/// The pthread_create contract: valid `thread` and (optional) `attr` pointers.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartRoutine,
    arg: *mut c_void,
) -> libc::c_int {
    let regs = start_regs();
    let real = real_pthread_create();
    crate::runtime::lifecycle::wait_while_another_finishes();
    if crate::phase::recording_stopped() {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real(thread, attr, routine, arg) };
    }
    // The new thread's agent state, taken here so that a lack of memory
    // for it is this call's failure (thread.rs, `Provision`).
    let Some(provision) = Provision::take() else {
        // What the C library answers when it cannot map a thread's stack.
        return libc::EAGAIN;
    };
    // Production mode's writer waits for the program's second thread.
    crate::services::writer::start_deferred();
    if crate::config::production() {
        crate::events::production_sync::creating_thread();
    }
    let create_id = threads::on_create(regs);
    let held = threads::starting_args::hold(arg as u64, create_id);
    let start = Box::into_raw(Box::new(Start {
        routine,
        arg,
        parent_tid: crate::platform::sys::gettid(),
        create_id,
        provision,
        held,
    }));
    // SAFETY: the caller's thread/attr, our wrapper and its argument.
    let rc = unsafe { real(thread, attr, thread_main, start.cast()) };
    if rc != 0 {
        // No thread took ownership of `start`.
        // SAFETY: `start` came from Box::into_raw above and was not handed over.
        let start = unsafe { Box::from_raw(start) };
        threads::starting_args::release(start.held);
        start.provision.give_back();
    }
    rc
}
