//! The encoding of every event, from one table.
//!
//! Each row of `event_codec!` names an event's tags, its variant and its
//! fields in the order they are written, each with the wire layout that
//! writes and reads it (a [`Put`] and [`Get`] pair side by side below). The
//! macro makes both [`put_event`] and [`get_event`] from the rows, so a new
//! event is one row and its two directions cannot disagree.

use super::{
    tag, AllocFn, ChunkContext, DecodeError, Decoder, Encoder, EndCounters, ErrorKind, Event,
    ExitKind, LockEvent, LockKind, LockMisuse, LockMode, LockOp, ModuleInfo, NoRoom, ProcessInfo,
    ProfileStopReason, RunTotals, ScanSkipReason, ScanStats, ScanTrigger, Segment, SnapshotKind,
    Verdict, MAX_ARGS, MAX_STACK_FRAMES,
};
use crate::varint::{unzigzag, zigzag};

/// Writes one field (or a group of fields, as a tuple of references).
trait Put<V> {
    fn put(&self, e: &mut Encoder<'_>, ctx: &mut ChunkContext, v: V) -> Result<(), NoRoom>;
}

/// Reads what the matching [`Put`] wrote.
trait Get<T> {
    fn get(&self, d: &mut Decoder<'_>) -> Result<T, DecodeError>;
}

/// The varint layouts of a `u64`.
#[derive(Clone, Copy)]
enum Varint {
    /// The value itself.
    U64,
    /// A timed event's time: the delta from the chunk's previous time.
    Time,
    /// A heap or lock address: the zig-zagged delta from the chunk's
    /// previous address (neighbouring blocks sit close together).
    Addr,
}

use Varint::{Addr, Time, U64};

impl Put<&u64> for Varint {
    #[inline(always)]
    fn put(&self, e: &mut Encoder<'_>, ctx: &mut ChunkContext, v: &u64) -> Result<(), NoRoom> {
        match self {
            U64 => e.u64(*v),
            Time => e.time(ctx, *v),
            Addr => e.addr(ctx, *v),
        }
    }
}

impl Get<u64> for Varint {
    #[inline(always)]
    fn get(&self, d: &mut Decoder<'_>) -> Result<u64, DecodeError> {
        match self {
            U64 => d.u64(),
            Time => d.time(),
            Addr => d.addr(),
        }
    }
}

/// A varint that must fit 32 bits; the name is the error's.
struct U32(&'static str);

impl Put<&u32> for U32 {
    #[inline(always)]
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &u32) -> Result<(), NoRoom> {
        e.u64(u64::from(*v))
    }
}

impl Get<u32> for U32 {
    #[inline(always)]
    fn get(&self, d: &mut Decoder<'_>) -> Result<u32, DecodeError> {
        d.u32(self.0)
    }
}

/// An enum stored as its format value in one byte.
trait FormatByte: Copy {
    fn format_byte(self) -> u8;
}

macro_rules! format_bytes {
    ($($t:ty),*) => {
        $(impl FormatByte for $t {
            #[inline(always)]
            fn format_byte(self) -> u8 {
                self as u8
            }
        })*
    };
}

format_bytes!(
    AllocFn,
    ErrorKind,
    SnapshotKind,
    ProfileStopReason,
    ScanTrigger,
    Verdict,
    ScanSkipReason,
    LockKind,
    LockMisuse
);

/// One byte holding an enum: its decoding function and, for values it
/// rejects, the error's name.
struct Byte<T>(fn(u8) -> Option<T>, &'static str);

impl<T> Byte<T> {
    #[inline(always)]
    fn parse(&self, v: u8) -> Result<T, DecodeError> {
        (self.0)(v).ok_or(DecodeError::Invalid(self.1))
    }
}

impl<T: FormatByte> Put<&T> for Byte<T> {
    #[inline(always)]
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &T) -> Result<(), NoRoom> {
        e.byte(v.format_byte())
    }
}

impl<T> Get<T> for Byte<T> {
    #[inline(always)]
    fn get(&self, d: &mut Decoder<'_>) -> Result<T, DecodeError> {
        self.parse(d.byte()?)
    }
}

/// Short names for the table's most common layouts.
macro_rules! shorthands {
    ($($(#[$doc:meta])* $name:ident: $t:ty = $layout:expr;)*) => {$(
        $(#[$doc])*
        struct $name;

        impl Put<&$t> for $name {
            #[inline(always)]
            fn put(
                &self,
                e: &mut Encoder<'_>,
                ctx: &mut ChunkContext,
                v: &$t,
            ) -> Result<(), NoRoom> {
                $layout.put(e, ctx, v)
            }
        }

        impl Get<$t> for $name {
            #[inline(always)]
            fn get(&self, d: &mut Decoder<'_>) -> Result<$t, DecodeError> {
                $layout.get(d)
            }
        }
    )*};
}

const ALLOC_FN: Byte<AllocFn> = Byte(AllocFn::from_u8, "allocation function");

shorthands! {
    /// A stack id.
    Stack: u32 = U32("stack id");
    /// The allocation function.
    Func: AllocFn = ALLOC_FN;
    /// The kind of lock.
    LockKindByte: LockKind = Byte(LockKind::from_u8, "lock kind");
}

/// An optional allocation function: 0 for none.
struct OptFunc;

impl Put<&Option<AllocFn>> for OptFunc {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        _: &mut ChunkContext,
        v: &Option<AllocFn>,
    ) -> Result<(), NoRoom> {
        e.byte(v.map_or(0, AllocFn::format_byte))
    }
}

impl Get<Option<AllocFn>> for OptFunc {
    fn get(&self, d: &mut Decoder<'_>) -> Result<Option<AllocFn>, DecodeError> {
        match d.byte()? {
            0 => Ok(None),
            v => ALLOC_FN.parse(v).map(Some),
        }
    }
}

/// A flag byte, 0 or 1; the name is the error's for other values.
struct Bool(&'static str);

impl Put<&bool> for Bool {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &bool) -> Result<(), NoRoom> {
        e.byte(u8::from(*v))
    }
}

impl Get<bool> for Bool {
    fn get(&self, d: &mut Decoder<'_>) -> Result<bool, DecodeError> {
        match d.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid(self.0)),
        }
    }
}

/// A length-prefixed UTF-8 string (invalid UTF-8 reads as replacement
/// characters); the name is the error's for an overlong one.
struct Str(&'static str);

impl Put<&String> for Str {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &String) -> Result<(), NoRoom> {
        e.bytes(v.as_bytes())
    }
}

impl Get<String> for Str {
    fn get(&self, d: &mut Decoder<'_>) -> Result<String, DecodeError> {
        d.string(self.0)
    }
}

/// Length-prefixed bytes.
struct Bytes(&'static str);

impl Put<&Vec<u8>> for Bytes {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &Vec<u8>) -> Result<(), NoRoom> {
        e.bytes(v)
    }
}

impl Get<Vec<u8>> for Bytes {
    fn get(&self, d: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
        Ok(d.bytes(self.0)?.to_vec())
    }
}

/// `List(max, what, item)`: a count, then that many items laid out by
/// `item`. A count over `max` is corrupt input, named `what` in the error.
struct List<K>(usize, &'static str, K);

impl<'a, T: 'a, K: Put<&'a T>> Put<&'a Vec<T>> for List<K> {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        ctx: &mut ChunkContext,
        v: &'a Vec<T>,
    ) -> Result<(), NoRoom> {
        e.u64(v.len() as u64)?;
        for x in v {
            self.2.put(e, ctx, x)?;
        }
        Ok(())
    }
}

impl<T, K: Get<T>> Get<Vec<T>> for List<K> {
    fn get(&self, d: &mut Decoder<'_>) -> Result<Vec<T>, DecodeError> {
        let n = d.u64()?;
        if n > self.0 as u64 {
            return Err(DecodeError::TooLong {
                what: self.1,
                len: n,
            });
        }
        // The count is not yet backed by input: reserve little up front.
        let mut items = Vec::with_capacity(n.min(64) as usize);
        for _ in 0..n {
            items.push(self.2.get(d)?);
        }
        Ok(items)
    }
}

/// A mapped segment: start, length, permission bits.
struct Seg;

impl Put<&Segment> for Seg {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, s: &Segment) -> Result<(), NoRoom> {
        e.u64(s.start)?;
        e.u64(s.end.wrapping_sub(s.start))?;
        e.byte(s.flags)
    }
}

impl Get<Segment> for Seg {
    fn get(&self, d: &mut Decoder<'_>) -> Result<Segment, DecodeError> {
        let start = d.u64()?;
        let len = d.u64()?;
        let flags = d.byte()?;
        let end = start
            .checked_add(len)
            .ok_or(DecodeError::Invalid("segment"))?;
        Ok(Segment { start, end, flags })
    }
}

/// A stack's frames: a count, then each frame as the zig-zagged delta from
/// the one before (frames of one stack sit close together).
pub(super) struct Frames;

impl Frames {
    /// The frames of a borrowed list (see [`Encoder::stack_def`]).
    pub(super) fn put_slice(e: &mut Encoder<'_>, frames: &[u64]) -> Result<(), NoRoom> {
        e.u64(frames.len() as u64)?;
        let mut prev = 0u64;
        for &f in frames {
            e.u64(zigzag(f.wrapping_sub(prev) as i64))?;
            prev = f;
        }
        Ok(())
    }
}

impl Put<&Vec<u64>> for Frames {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &Vec<u64>) -> Result<(), NoRoom> {
        Frames::put_slice(e, v)
    }
}

impl Get<Vec<u64>> for Frames {
    fn get(&self, d: &mut Decoder<'_>) -> Result<Vec<u64>, DecodeError> {
        let n = d.u64()?;
        if n > MAX_STACK_FRAMES as u64 {
            return Err(DecodeError::TooLong {
                what: "stack",
                len: n,
            });
        }
        let mut frames = Vec::with_capacity(n as usize);
        let mut prev = 0u64;
        for _ in 0..n {
            prev = prev.wrapping_add(unzigzag(d.u64()?) as u64);
            frames.push(prev);
        }
        Ok(frames)
    }
}

/// How the process image ended: 0 and an exit code, 1 and a signal (both
/// zig-zagged), or 2 for an exec.
struct Exit;

impl Put<&ExitKind> for Exit {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &ExitKind) -> Result<(), NoRoom> {
        match *v {
            ExitKind::Code(c) => {
                e.byte(0)?;
                e.u64(zigzag(i64::from(c)))
            }
            ExitKind::Signal(s) => {
                e.byte(1)?;
                e.u64(zigzag(i64::from(s)))
            }
            ExitKind::Exec => e.byte(2),
            ExitKind::Detach => e.byte(3),
        }
    }
}

impl Get<ExitKind> for Exit {
    fn get(&self, d: &mut Decoder<'_>) -> Result<ExitKind, DecodeError> {
        Ok(match d.byte()? {
            0 => ExitKind::Code(d.i32("exit code")?),
            1 => ExitKind::Signal(d.i32("signal")?),
            2 => ExitKind::Exec,
            3 => ExitKind::Detach,
            _ => return Err(DecodeError::Invalid("exit kind")),
        })
    }
}

/// An errno value (or another C `int`: a signal's `si_code`), stored as
/// its 32 bits.
struct Errno;

impl Put<&i32> for Errno {
    fn put(&self, e: &mut Encoder<'_>, _: &mut ChunkContext, v: &i32) -> Result<(), NoRoom> {
        e.u64(u64::from(*v as u32))
    }
}

impl Get<i32> for Errno {
    fn get(&self, d: &mut Decoder<'_>) -> Result<i32, DecodeError> {
        Ok(d.u32("errno")? as i32)
    }
}

/// A lock event's flags byte (see [`super::locks::flags`]) holding the
/// lock's kind and mode, and for acquisitions and failures how it was asked
/// for. Bits a group does not hold are written 0 and not checked on reading.
struct LockFlags;

impl Put<(&LockKind, &LockMode)> for LockFlags {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        _: &mut ChunkContext,
        (kind, mode): (&LockKind, &LockMode),
    ) -> Result<(), NoRoom> {
        e.byte(super::locks::flags(*kind, *mode, LockOp::Blocking, false))
    }
}

impl Get<(LockKind, LockMode)> for LockFlags {
    fn get(&self, d: &mut Decoder<'_>) -> Result<(LockKind, LockMode), DecodeError> {
        let (kind, mode, _, _) = d.lock_flags()?;
        Ok((kind, mode))
    }
}

impl Put<(&LockKind, &LockMode, &LockOp)> for LockFlags {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        _: &mut ChunkContext,
        (kind, mode, op): (&LockKind, &LockMode, &LockOp),
    ) -> Result<(), NoRoom> {
        e.byte(super::locks::flags(*kind, *mode, *op, false))
    }
}

impl Get<(LockKind, LockMode, LockOp)> for LockFlags {
    fn get(&self, d: &mut Decoder<'_>) -> Result<(LockKind, LockMode, LockOp), DecodeError> {
        let (kind, mode, op, _) = d.lock_flags()?;
        Ok((kind, mode, op))
    }
}

/// An acquisition's flags byte and stack id, then its wait when the
/// flags' contended bit says one follows.
struct Acquisition;

type AcquisitionFields = (LockKind, LockMode, LockOp, u32, Option<u64>);

impl Put<(&LockKind, &LockMode, &LockOp, &u32, &Option<u64>)> for Acquisition {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        ctx: &mut ChunkContext,
        (kind, mode, op, stack, wait_ns): (&LockKind, &LockMode, &LockOp, &u32, &Option<u64>),
    ) -> Result<(), NoRoom> {
        e.byte(super::locks::flags(*kind, *mode, *op, wait_ns.is_some()))?;
        Stack.put(e, ctx, stack)?;
        match wait_ns {
            Some(w) => e.u64(*w),
            None => Ok(()),
        }
    }
}

impl Get<AcquisitionFields> for Acquisition {
    fn get(&self, d: &mut Decoder<'_>) -> Result<AcquisitionFields, DecodeError> {
        let (kind, mode, op, contended) = d.lock_flags()?;
        let stack = Stack.get(d)?;
        let wait_ns = if contended { Some(d.u64()?) } else { None };
        Ok((kind, mode, op, stack, wait_ns))
    }
}

/// Bit of `Recording`'s flag word saying a module name follows: the
/// program's allocator shadows the agent's (format version 4).
const RECORDING_SHADOWED_BIT: u32 = 1;
/// Bit saying the allocator library's path follows (after the shadowing
/// module's, if both; format version 5).
const RECORDING_LIBRARY_BIT: u32 = 2;
/// Bits saying allocations, or locks, were not recorded (format version
/// 11): a trace without them was recorded with both.
const RECORDING_NO_MEMORY_BIT: u32 = 3;
const RECORDING_NO_LOCKS_BIT: u32 = 4;
/// Bit saying the mean bytes between sampled stacks follows (format
/// version 12): a trace without it took every allocation's full stack.
const RECORDING_SAMPLED_BIT: u32 = 5;
/// Bit saying the recording was in production mode (format version 17).
const RECORDING_PRODUCTION_BIT: u32 = 6;

/// `Recording`'s fields, in the order of the event.
type RecordingFields = (bool, Option<String>, Option<String>, bool, bool, u64, bool);

/// `Recording`'s options: a flag word (so later options need no new tag)
/// whose bits say which of the optional module paths follow it.
struct RecordingOptions;

type RecordingRefs<'a> = (
    &'a bool,
    &'a Option<String>,
    &'a Option<String>,
    &'a bool,
    &'a bool,
    &'a u64,
    &'a bool,
);

impl Put<RecordingRefs<'_>> for RecordingOptions {
    fn put(
        &self,
        e: &mut Encoder<'_>,
        _: &mut ChunkContext,
        (no_release_stacks, shadowed_by, library, memory, locks, sample_bytes, production): RecordingRefs<'_>,
    ) -> Result<(), NoRoom> {
        let flags = u64::from(*no_release_stacks)
            | u64::from(shadowed_by.is_some()) << RECORDING_SHADOWED_BIT
            | u64::from(library.is_some()) << RECORDING_LIBRARY_BIT
            | u64::from(!*memory) << RECORDING_NO_MEMORY_BIT
            | u64::from(!*locks) << RECORDING_NO_LOCKS_BIT
            | u64::from(*sample_bytes != 0) << RECORDING_SAMPLED_BIT
            | u64::from(*production) << RECORDING_PRODUCTION_BIT;
        e.u64(flags)?;
        for module in [shadowed_by, library].into_iter().flatten() {
            e.bytes(module.as_bytes())?;
        }
        if *sample_bytes != 0 {
            e.u64(*sample_bytes)?;
        }
        Ok(())
    }
}

impl Get<RecordingFields> for RecordingOptions {
    fn get(&self, d: &mut Decoder<'_>) -> Result<RecordingFields, DecodeError> {
        let flags = d.u64()?;
        if flags >> (RECORDING_PRODUCTION_BIT + 1) != 0 {
            return Err(DecodeError::Invalid("recording flags"));
        }
        let bit = |b: u32| flags >> b & 1 != 0;
        let shadowed_by = if bit(RECORDING_SHADOWED_BIT) {
            Some(d.string("shadowing module")?)
        } else {
            None
        };
        let library = if bit(RECORDING_LIBRARY_BIT) {
            Some(d.string("allocator library")?)
        } else {
            None
        };
        let sample_bytes = if bit(RECORDING_SAMPLED_BIT) {
            match d.u64()? {
                0 => return Err(DecodeError::Invalid("mean bytes between samples")),
                n => n,
            }
        } else {
            0
        };
        Ok((
            flags & 1 != 0,
            shadowed_by,
            library,
            !bit(RECORDING_NO_MEMORY_BIT),
            !bit(RECORDING_NO_LOCKS_BIT),
            sample_bytes,
            bit(RECORDING_PRODUCTION_BIT),
        ))
    }
}

/// Makes [`put_event`] and [`get_event`] from the table's rows:
///
/// `TAG | OLDER_TAG as t => Variant { field: Layout, ... } write { tag }`
///
/// - The event is written with the first tag, or the one the optional
///   `write` block picks from the fields, and read from any tag listed;
///   `as t` names the tag for the fields' conditions.
/// - `Variant(Struct { ... })`: a variant that wraps a struct.
/// - `field: Layout if condition`: written and read only when the
///   condition (on the tag, or on fields before it) holds; read as the
///   default otherwise.
/// - `field: Struct { field: Layout, ... }`: a struct's fields, inline.
/// - `(a, b): Layout`: fields that one layout writes together.
macro_rules! event_codec {
    ($(
        $tag:ident $(| $alt:ident)* $(as $t:ident)? => $variant:ident $body:tt
        $(write $write:block)?
    ),* $(,)?) => {
        /// Encodes any event.
        pub(super) fn put_event(
            e: &mut Encoder<'_>,
            ctx: &mut ChunkContext,
            ev: &Event,
        ) -> Result<(), NoRoom> {
            match ev {
                $(codec_row!(@pattern $variant $body) => {
                    let written: u8 = codec_row!(@write tag::$tag $(, $write)?);
                    $(let $t = written;)?
                    e.byte(written)?;
                    codec_row!(@put e ctx $body);
                    Ok(())
                })*
            }
        }

        /// Decodes one event. Out of line: inlined into the iterator's
        /// `next`, decoding took a quarter longer (17 against 22 ns an
        /// allocation event).
        #[inline(never)]
        pub(super) fn get_event(d: &mut Decoder<'_>) -> Result<Event, DecodeError> {
            let read = d.byte()?;
            match read {
                $(tag::$tag $(| tag::$alt)* => {
                    $(let $t = read;)?
                    codec_row!(@get d $body);
                    Ok(codec_row!(@pattern $variant $body))
                })*
                other => Err(DecodeError::UnknownTag(other)),
            }
        }
    };
}

/// The parts of one row of `event_codec!`: its shape (the pattern that
/// binds every field when encoding, the expression that builds the event
/// when decoding), and its fields' writes and reads, in order.
macro_rules! codec_row {
    (@pattern $variant:ident { $($items:tt)* }) => {
        codec_row!(@shape [Event::$variant] [] $($items)*)
    };
    (@pattern $variant:ident ($($inner:ident)::+ { $($items:tt)* })) => {
        Event::$variant(codec_row!(@shape [$($inner)::+] [] $($items)*))
    };
    (@shape [$($path:tt)*] [$($done:tt)*]) => { $($path)* { $($done)* } };
    (@shape $path:tt [$($done:tt)*]
        $field:ident : $struct:ident {
            $($sub:ident : $sub_k:ident $(($($sub_a:tt)*))? $(if $sub_c:expr)?),+ $(,)?
        }
        $(, $($rest:tt)*)?
    ) => {
        codec_row!(@shape $path [$($done)* $field: $struct { $($sub),+ },] $($($rest)*)?)
    };
    (@shape $path:tt [$($done:tt)*]
        ($($field:ident),+) : $k:ident $(($($a:tt)*))? $(, $($rest:tt)*)?
    ) => {
        codec_row!(@shape $path [$($done)* $($field,)+] $($($rest)*)?)
    };
    (@shape $path:tt [$($done:tt)*]
        $field:ident : $k:ident $(($($a:tt)*))? $(if $c:expr)? $(, $($rest:tt)*)?
    ) => {
        codec_row!(@shape $path [$($done)* $field,] $($($rest)*)?)
    };

    (@write $tag:expr) => { $tag };
    (@write $tag:expr, $write:block) => { $write };

    // Writes and reads go field by field, a struct's fields inline: its
    // items are spliced into the row's (and the stray comma skipped).
    (@put $e:ident $ctx:ident { $($items:tt)* }) => { codec_row!(@puts $e $ctx $($items)*) };
    (@put $e:ident $ctx:ident ($($inner:ident)::+ { $($items:tt)* })) => {
        codec_row!(@puts $e $ctx $($items)*)
    };
    (@puts $e:ident $ctx:ident) => {};
    (@puts $e:ident $ctx:ident , $($rest:tt)*) => { codec_row!(@puts $e $ctx $($rest)*) };
    (@puts $e:ident $ctx:ident $field:ident : $struct:ident { $($inner:tt)* } $($rest:tt)*) => {
        codec_row!(@puts $e $ctx $($inner)* , $($rest)*)
    };
    (@puts $e:ident $ctx:ident
        ($($field:ident),+) : $k:ident $(($($a:tt)*))? $(, $($rest:tt)*)?
    ) => {
        Put::put(&$k $(($($a)*))?, $e, $ctx, ($($field),+))?;
        codec_row!(@puts $e $ctx $($($rest)*)?)
    };
    (@puts $e:ident $ctx:ident
        $field:ident : $k:ident $(($($a:tt)*))? if $c:expr $(, $($rest:tt)*)?
    ) => {
        if $c {
            Put::put(&$k $(($($a)*))?, $e, $ctx, $field)?;
        }
        codec_row!(@puts $e $ctx $($($rest)*)?)
    };
    (@puts $e:ident $ctx:ident $field:ident : $k:ident $(($($a:tt)*))? $(, $($rest:tt)*)?) => {
        Put::put(&$k $(($($a)*))?, $e, $ctx, $field)?;
        codec_row!(@puts $e $ctx $($($rest)*)?)
    };

    // Each field read becomes a local of its name.
    (@get $d:ident { $($items:tt)* }) => { codec_row!(@gets $d $($items)*) };
    (@get $d:ident ($($inner:ident)::+ { $($items:tt)* })) => { codec_row!(@gets $d $($items)*) };
    (@gets $d:ident) => {};
    (@gets $d:ident , $($rest:tt)*) => { codec_row!(@gets $d $($rest)*) };
    (@gets $d:ident $field:ident : $struct:ident { $($inner:tt)* } $($rest:tt)*) => {
        codec_row!(@gets $d $($inner)* , $($rest)*)
    };
    (@gets $d:ident ($($field:ident),+) : $k:ident $(($($a:tt)*))? $(, $($rest:tt)*)?) => {
        let ($($field),+) = Get::get(&$k $(($($a)*))?, $d)?;
        codec_row!(@gets $d $($($rest)*)?)
    };
    (@gets $d:ident $field:ident : $k:ident $(($($a:tt)*))? if $c:expr $(, $($rest:tt)*)?) => {
        let $field = if $c {
            Get::get(&$k $(($($a)*))?, $d)?
        } else {
            Default::default()
        };
        codec_row!(@gets $d $($($rest)*)?)
    };
    (@gets $d:ident $field:ident : $k:ident $(($($a:tt)*))? $(, $($rest:tt)*)?) => {
        let $field = Get::get(&$k $(($($a)*))?, $d)?;
        codec_row!(@gets $d $($($rest)*)?)
    };
}

// The trace format, one event a row, in the order of the tags (see `tag`).
event_codec! {
    PROCESS => Process(ProcessInfo {
        pid: U32("pid"),
        ppid: U32("ppid"),
        start_unix_ns: U64,
        exe: Str("executable path"),
        argv: List(MAX_ARGS, "argument list", Str("argument")),
    }),
    MODULE_LOAD => ModuleLoad(ModuleInfo {
        id: U32("module id"),
        path: Str("module path"),
        build_id: Bytes("build id"),
        bias: U64,
        segments: List(256, "segment list", Seg),
    }),
    MODULE_UNLOAD => ModuleUnload { id: U32("module id") },
    THREAD_NAME => ThreadName { tid: U32("thread id"), name: Str("thread name") },
    STACK_DEF => StackDef { id: U32("stack id"), frames: Frames },
    CALLER_ONLY_STACK => CallerOnlyStack { id: U32("stack id") },
    THREAD_CREATE => ThreadCreate { time: Time, create_id: U64, stack: Stack },
    THREAD_START => ThreadStart { time: Time, parent_tid: U32("thread id"), create_id: U64 },
    THREAD_END => ThreadEnd { time: Time },

    ALLOC => Alloc { time: Time, addr: Addr, size: U64, align: U64, func: Func, stack: Stack },
    FREE => Free { time: Time, addr: Addr, func: Func, stack: Stack },
    REALLOC => Realloc {
        time: Time,
        old_addr: Addr,
        new_addr: Addr,
        size: U64,
        func: Func,
        stack: Stack,
    },
    ERROR => Error {
        time: Time,
        kind: Byte(ErrorKind::from_u8, "error kind"),
        func: Func,
        addr: U64,
        stack: Stack,
        alloc_func: OptFunc,
        alloc_size: U64,
        alloc_stack: Stack,
        free_stack: Stack,
        passed_on: Bool("passed_on flag"),
        given: U64 if kind.has_given(),
    },
    ALLOC_FAILED => AllocFailed { time: Time, func: Func, size: U64, align: U64, stack: Stack },

    SNAPSHOT_BEGIN => SnapshotBegin {
        time: Time,
        kind: Byte(SnapshotKind::from_u8, "snapshot kind"),
    },
    LIVE_BLOCK => LiveBlock { addr: Addr, size: U64, func: Func, stack: Stack },
    SNAPSHOT_END => SnapshotEnd { blocks: U64, bytes: U64 },
    SCAN_BEGIN => ScanBegin {
        time: Time,
        scan: U32("scan number"),
        trigger: Byte(ScanTrigger::from_u8, "scan trigger"),
    },
    SCAN_BLOCK => ScanBlock {
        scan: U32("scan number"),
        addr: Addr,
        size: U64,
        func: Func,
        stack: Stack,
        verdict: Byte(Verdict::from_u8, "verdict"),
        indirect_bytes: U64,
    },
    // Older readers know only tag 37: it stays while there is nothing new to say.
    SCAN_END | SCAN_END_WITH_MAPPINGS as t => ScanEnd {
        scan: U32("scan number"),
        stats: ScanStats {
            pause_ns: U64,
            threads: U32("thread count"),
            threads_not_suspended: U32("thread count"),
            root_bytes: U64,
            blocks: U64,
            bytes: U64,
            mappings_not_excluded: U64 if t == tag::SCAN_END_WITH_MAPPINGS,
        },
    } write {
        if *mappings_not_excluded != 0 {
            tag::SCAN_END_WITH_MAPPINGS
        } else {
            tag::SCAN_END
        }
    },
    SCAN_SKIPPED => ScanSkipped {
        time: Time,
        trigger: Byte(ScanTrigger::from_u8, "scan trigger"),
        reason: Byte(ScanSkipReason::from_u8, "scan skip reason"),
        needed: U64,
        available: U64,
        limit: U64,
    },

    FORK => Fork { time: Time, child_pid: U32("pid") },
    END => End {
        time: Time,
        exit: Exit,
        counters: EndCounters { events: U64, events_lost: U64, untracked_calls: U64 },
    },
    RUN_TOTALS_WITH_FAILED | RUN_TOTALS as t => RunTotals(RunTotals {
        allocation_calls: U64,
        release_calls: U64,
        errors: U64,
        peak_bytes: U64,
        peak_time: U64,
        failed_allocations: U64 if t == tag::RUN_TOTALS_WITH_FAILED,
    }),
    RECORDING => Recording {
        (no_release_stacks, allocator_shadowed_by, allocator_library, memory_recorded, locks_recorded,
            sample_bytes, production): RecordingOptions,
    },

    LOCK_INIT => Lock(LockEvent::Init { time: Time, addr: Addr, kind: LockKindByte, stack: Stack }),
    LOCK_DESTROY =>
        Lock(LockEvent::Destroy { time: Time, addr: Addr, kind: LockKindByte, stack: Stack }),
    LOCK_ACQUIRE => Lock(LockEvent::Acquire {
        time: Time,
        addr: Addr,
        (kind, mode, op, stack, wait_ns): Acquisition,
    }),
    LOCK_RELEASE | LOCK_RELEASE_WITH_AGENT_TIME as t => Lock(LockEvent::Release {
        time: Time,
        addr: Addr,
        kind: LockKindByte,
        stack: Stack,
        agent_ns: U64 if t == tag::LOCK_RELEASE_WITH_AGENT_TIME,
    }) write {
        if *agent_ns != 0 {
            tag::LOCK_RELEASE_WITH_AGENT_TIME
        } else {
            tag::LOCK_RELEASE
        }
    },
    LOCK_REQUEST =>
        Lock(LockEvent::Request { time: Time, addr: Addr, (kind, mode): LockFlags, stack: Stack }),
    LOCK_FAILED => Lock(LockEvent::Failed {
        time: Time,
        addr: Addr,
        (kind, mode, op): LockFlags,
        errno: Errno,
        stack: Stack,
    }),
    LOCK_MISUSE => Lock(LockEvent::Misuse {
        time: Time,
        addr: Addr,
        kind: LockKindByte,
        misuse: Byte(LockMisuse::from_u8, "lock misuse"),
        errno: Errno,
        stack: Stack,
    }),
    JOIN => Lock(LockEvent::Join { time: Time, joined: U32("thread id"), stack: Stack }),
    DETACH => Lock(LockEvent::Detach { time: Time, detached: U32("thread id") }),
    THREAD_EXIT => Lock(LockEvent::Exit { time: Time, stack: Stack }),
    JOIN_WAIT => Lock(LockEvent::JoinWait { time: Time, joined: U32("thread id"), stack: Stack }),

    PROFILE_START => ProfileStart { time: Time, hz: U32("sampling rate"), signal: U32("signal") },
    SAMPLE => Sample { time: Time, stack: Stack, periods: U32("sample periods") },
    AGENT_SAMPLES => AgentSamples { time: Time, stack: Stack, periods: U32("sample periods") },
    SAMPLES_SKIPPED => SamplesSkipped { time: Time, periods: U64 },
    PROFILE_STOP => ProfileStop {
        time: Time,
        reason: Byte(ProfileStopReason::from_u8, "profile stop reason"),
    },
    SAMPLES_MISSED => SamplesMissed { time: Time, periods: U64 },
    SITE_VERDICT => SiteVerdict {
        time: Time,
        stack: Stack,
        func: Func,
        kinds: U64,
        growth_bytes_per_second: U64,
        watched_blocks: U64,
        untouched_blocks: U64,
        untouched_ns: U64,
        last_access_ns: U64,
    },
    CONTROL_SOCKET => ControlSocket { path: Str("control socket path") },
    ATTACH => Attach { time: Time },
    ATTACH_TOTALS => AttachTotals { earlier_releases: U64 },
    CRASH => Crash { time: Time, signal: U32("signal"), code: Errno, addr: U64, stack: Stack },
    STOPPED_AT_CRASH => StoppedAtCrash { time: Time, stack: Stack },
    CALL_COUNTS => CallCounts { time: Time, func: Func, calls: U64, bytes: U64 },
}
