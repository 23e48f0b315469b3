//! The seccomp filter every sandboxed command runs under: classic BPF over `struct seccomp_data`,
//! built in the parent as plain data and handed to the kernel in the child.
//!
//! landlock confines files (and, on ABI 4 and later, TCP ports); namespaces confine processes
//! and the network. What neither covers is refused here, by system call and argument:
//!
//! 1. a system call of another architecture (the i386 entry of an x86_64 kernel) kills the
//!    process, and so does an x32 call on x86_64: their numbers mean other calls;
//! 2. `socket()` is allowed for `AF_INET` and `AF_INET6` only, and only when the command may
//!    have IP sockets at all ([`Sockets::Inet`]); every other family fails with `EACCES`:
//!    `AF_UNIX` (landlock up to ABI 7 does not control connecting to a filesystem socket, so an
//!    ssh-agent, the D-Bus bus or `docker.sock` would be a way out), `AF_NETLINK` (the kernel's
//!    routing, audit and uevent interfaces), `AF_PACKET`, and the rest;
//!    An IP socket must be a stream or a datagram, of the default protocol, TCP, UDP or ICMP
//!    (else `EACCES`): another (SCTP, DCCP...) has the kernel load and run a protocol module no
//!    command here needs, and the default protocol of a `SOCK_SEQPACKET` is SCTP's;
//! 3. `socketpair` fails with `EACCES` unless the family is `AF_UNIX` (the kernel makes a
//!    socket of the family asked, loading its module, before it finds the family has no pairs)
//!    and the type `SOCK_STREAM` or `SOCK_SEQPACKET`: a datagram socketpair's socket can
//!    `sendto` (or `connect` to) any datagram socket by path. Stream and seqpacket pairs are
//!    connected to each other for good and reach nothing else;
//! 4. `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with `EPERM`: io_uring
//!    creates and connects sockets without the `socket` system call;
//! 5. new namespaces: `unshare` and `clone` with any `CLONE_NEW*` flag, and `setns`, fail with
//!    `EPERM`; `clone3`, whose flags live in memory a filter cannot read, fails with `ENOSYS`, so
//!    that the C library falls back to `clone`. A command cannot make itself a user namespace
//!    (and with it capabilities over a namespace of its own, a large part of the kernel's attack
//!    surface) or join another one;
//! 6. `bpf`, `keyctl`, `add_key` and `request_key` fail with `EPERM`: the kernel's BPF loader and
//!    the key rings (shared by every process of a user) are not for commands;
//! 7. a file mode with set-user-ID or set-group-ID fails with `EPERM`: `chmod`, `fchmod`,
//!    `fchmodat`, `fchmodat2`, `mknod` and `mknodat` with either bit, and `open`, `openat` and
//!    `creat` that create a file (`O_CREAT`, `O_TMPFILE`) with either; `openat2`, whose mode
//!    lives in memory a filter cannot read, fails with `ENOSYS` (the C library falls back to
//!    `openat`). Inside the sandbox the workspace is mounted `nosuid`, but outside it is not:
//!    a set-user-ID copy of a shell left in the folder would let anyone who runs it act as the
//!    folder's owner;
//! 8. everything else is allowed (landlock, namespaces, rlimits and the process tree do the
//!    rest).

use std::mem::offset_of;

use nix::libc;

/// The audit architecture (`AUDIT_ARCH_*` in `linux/audit.h`) whose system calls the filter
/// knows, or `None` where commands cannot be sandboxed.
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: Option<u32> = Some(0xc000_003e); // AUDIT_ARCH_X86_64
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
pub(crate) const AUDIT_ARCH: Option<u32> = Some(0xc000_00b7); // AUDIT_ARCH_AARCH64
#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_endian = "little")
)))]
pub(crate) const AUDIT_ARCH: Option<u32> = None;

/// On x86_64, x32 system calls share the architecture but have this bit set in their number;
/// they would bypass a filter written for x86_64 numbers.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: Option<u32> = Some(0x4000_0000);
#[cfg(not(target_arch = "x86_64"))]
const X32_SYSCALL_BIT: Option<u32> = None;

/// Every `CLONE_NEW*` flag: a new namespace of any kind.
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32
    | 0x80; // CLONE_NEWTIME

/// Which `socket()` calls a command may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// None at all (connected `socketpair`s still work): the network is off and there is no
    /// network namespace to keep it off.
    None,
    /// `AF_INET` and `AF_INET6` only: what it can reach is decided by its network namespace (a
    /// loopback of its own, or the host's network).
    Inet,
}

/// A jump target of the assembler below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Allow,
    Kill,
    Eacces,
    Eperm,
    Enosys,
    Socket,
    Socketpair,
    /// The type of an `AF_INET` or `AF_INET6` socket...
    InetProtocol,
    /// ...and its protocol.
    InetProtocolOf,
    NamespaceFlags,
    /// The mode is argument 1 (`chmod`, `fchmod`, `creat`, `mknod`).
    Mode1,
    /// The mode is argument 2 (`fchmodat`, `fchmodat2`, `mknodat`).
    Mode2,
    /// `open(path, flags, mode)`: the mode counts when the flags create a file.
    Open,
    /// `openat(dirfd, path, flags, mode)`: the same.
    Openat,
}

/// The protocols an IP socket may be made with: the family's default (0), TCP, UDP, and ICMP
/// and ICMPv6 (unprivileged `ping` sockets).
const INET_PROTOCOLS: [i32; 5] = [
    0,
    libc::IPPROTO_TCP,
    libc::IPPROTO_UDP,
    libc::IPPROTO_ICMP,
    libc::IPPROTO_ICMPV6,
];

/// The set-user-ID and set-group-ID bits of a file mode.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// The `open` flags that create a file, whose mode argument then counts: `O_CREAT` and
/// `__O_TMPFILE` (`O_TMPFILE` without `O_DIRECTORY`).
const CREATING: u32 = (libc::O_CREAT | (libc::O_TMPFILE & !libc::O_DIRECTORY)) as u32;

/// `fchmodat2` (Linux 6.6): the same number on every architecture.
const SYS_FCHMODAT2: libc::c_long = 452;

/// The calls that set a mode, and where their mode argument is ([`Label::Mode1`],
/// [`Label::Mode2`], [`Label::Open`], [`Label::Openat`]).
fn mode_calls() -> Vec<(libc::c_long, Label)> {
    let mut calls = vec![
        (libc::SYS_fchmod, Label::Mode1),
        (libc::SYS_fchmodat, Label::Mode2),
        (SYS_FCHMODAT2, Label::Mode2),
        (libc::SYS_mknodat, Label::Mode2),
        (libc::SYS_openat, Label::Openat),
        (libc::SYS_openat2, Label::Enosys),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        (libc::SYS_chmod, Label::Mode1),
        (libc::SYS_creat, Label::Mode1),
        (libc::SYS_mknod, Label::Mode1),
        (libc::SYS_open, Label::Open),
    ]);
    calls
}

/// One instruction, with symbolic jump targets (`None`: the next instruction).
#[derive(Debug, Clone, Copy)]
enum Ins {
    /// Load the 32-bit word at this offset of `struct seccomp_data`.
    Load(usize),
    /// `A &= k`.
    And(u32),
    /// Jump to `t` if `A == k`, else to `f`.
    Eq(u32, Option<Label>, Option<Label>),
    /// Jump to `t` if `A >= k`, else to `f`.
    Ge(u32, Option<Label>, Option<Label>),
    /// Jump to `t` if `A & k != 0`, else to `f`.
    Set(u32, Option<Label>, Option<Label>),
    /// Return this action.
    Ret(u32),
    /// A position, not an instruction.
    At(Label),
}

/// Resolves labels into relative jumps. Jumps only go forward, as the kernel requires.
fn assemble(program: &[Ins]) -> Vec<libc::sock_filter> {
    let mut positions = Vec::new();
    let mut pc = 0usize;
    for ins in program {
        match ins {
            Ins::At(label) => positions.push((*label, pc)),
            _ => pc += 1,
        }
    }
    let at = |label: Label| {
        positions
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("label {label:?} is not placed"))
    };
    let mut out = Vec::with_capacity(pc);
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    for ins in program {
        let here = out.len();
        let offset = |target: Option<Label>| -> u8 {
            match target {
                None => 0,
                Some(label) => {
                    let to = at(label);
                    assert!(to > here, "jump from {here} back to {label:?}");
                    u8::try_from(to - here - 1).expect("jump within 255 instructions")
                }
            }
        };
        let jump = |op: u32, k: u32, t, f| libc::sock_filter {
            code: (libc::BPF_JMP | op | libc::BPF_K) as u16,
            jt: offset(t),
            jf: offset(f),
            k,
        };
        match *ins {
            Ins::Load(offset) => out.push(stmt(
                libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
                offset as u32,
            )),
            Ins::And(k) => out.push(stmt(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, k)),
            Ins::Eq(k, t, f) => out.push(jump(libc::BPF_JEQ, k, t, f)),
            Ins::Ge(k, t, f) => out.push(jump(libc::BPF_JGE, k, t, f)),
            Ins::Set(k, t, f) => out.push(jump(libc::BPF_JSET, k, t, f)),
            Ins::Ret(action) => out.push(stmt(libc::BPF_RET | libc::BPF_K, action)),
            Ins::At(_) => {}
        }
    }
    out
}

/// The filter for commands that may make the `socket()` calls `sockets` says; `None` on
/// architectures it does not know (commands are then refused like on a kernel without
/// landlock). See the module documentation for what it refuses.
pub fn filter(sockets: Sockets) -> Option<Vec<libc::sock_filter>> {
    use Ins::*;
    use Label::*;

    let arch = AUDIT_ARCH?;
    // The low 32 bits of an argument (both supported architectures are little-endian); the
    // kernel reads `int` arguments from those bits only, so the high ones cannot hide a value.
    let arg = |n: usize| offset_of!(libc::seccomp_data, args) + 8 * n;
    let nr = |sys: libc::c_long| sys as u32;
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | e as u32;

    let mut program = vec![
        Load(offset_of!(libc::seccomp_data, arch)),
        Eq(arch, None, Some(Kill)),
        Load(offset_of!(libc::seccomp_data, nr)),
    ];
    if let Some(x32) = X32_SYSCALL_BIT {
        program.push(Ge(x32, Some(Kill), None));
    }
    for (call, to) in [
        (libc::SYS_socket, Socket),
        (libc::SYS_socketpair, Socketpair),
        (libc::SYS_io_uring_setup, Eperm),
        (libc::SYS_io_uring_enter, Eperm),
        (libc::SYS_io_uring_register, Eperm),
        (libc::SYS_unshare, NamespaceFlags),
        (libc::SYS_clone, NamespaceFlags),
        (libc::SYS_setns, Eperm),
        (libc::SYS_clone3, Enosys),
        (libc::SYS_bpf, Eperm),
        (libc::SYS_keyctl, Eperm),
        (libc::SYS_add_key, Eperm),
        (libc::SYS_request_key, Eperm),
    ] {
        program.push(Eq(nr(call), Some(to), None));
    }
    for (call, to) in mode_calls() {
        program.push(Eq(nr(call), Some(to), None));
    }
    program.push(Ret(libc::SECCOMP_RET_ALLOW));

    // The calls that set a mode: never with set-user-ID or set-group-ID.
    program.extend([
        At(Open),
        Load(arg(1)),
        Set(CREATING, None, Some(Allow)),
        Load(arg(2)),
        Set(SET_ID_BITS, Some(Eperm), Some(Allow)),
        At(Openat),
        Load(arg(2)),
        Set(CREATING, None, Some(Allow)),
        Load(arg(3)),
        Set(SET_ID_BITS, Some(Eperm), Some(Allow)),
        At(Mode1),
        Load(arg(1)),
        Set(SET_ID_BITS, Some(Eperm), Some(Allow)),
        At(Mode2),
        Load(arg(2)),
        Set(SET_ID_BITS, Some(Eperm), Some(Allow)),
    ]);

    // socket(domain, type, protocol).
    program.extend([At(Socket), Load(arg(0))]);
    if sockets == Sockets::Inet {
        program.extend([
            Eq(libc::AF_INET as u32, Some(InetProtocol), None),
            Eq(libc::AF_INET6 as u32, Some(InetProtocol), None),
        ]);
    }
    program.push(Ret(errno(libc::EACCES)));
    // The type and protocol of an IP socket: a stream or a datagram (without
    // SOCK_NONBLOCK/CLOEXEC), of the type's default protocol, TCP, UDP or ICMP (a `ping`
    // socket). Any other (SCTP, DCCP, L2TP, MPTCP) has the kernel load and run a protocol
    // module nothing here needs; and the default protocol of another type (`SOCK_SEQPACKET`,
    // `SOCK_DCCP`) is one of those, when its module is loaded.
    if sockets == Sockets::Inet {
        program.extend([
            At(InetProtocol),
            Load(arg(1)),
            And(0xf),
            Eq(libc::SOCK_STREAM as u32, Some(InetProtocolOf), None),
            Eq(libc::SOCK_DGRAM as u32, Some(InetProtocolOf), None),
            Ret(errno(libc::EACCES)),
            At(InetProtocolOf),
            Load(arg(2)),
        ]);
        for protocol in INET_PROTOCOLS {
            program.push(Eq(protocol as u32, Some(Allow), None));
        }
        program.push(Ret(errno(libc::EACCES)));
    }

    // socketpair(domain, type, protocol, sv): Unix only (the kernel makes a socket of the
    // family asked before it finds the family has no pairs, loading its module: TIPC, RDS,
    // KCM...); the type without SOCK_NONBLOCK/CLOEXEC.
    program.extend([
        At(Socketpair),
        Load(arg(0)),
        Eq(libc::AF_UNIX as u32, None, Some(Eacces)),
        Load(arg(1)),
        And(0xf),
        Eq(libc::SOCK_STREAM as u32, Some(Allow), None),
        Eq(libc::SOCK_SEQPACKET as u32, Some(Allow), None),
        Ret(errno(libc::EACCES)),
    ]);

    // unshare(flags) and clone(flags, ...): no new namespace of any kind.
    program.extend([
        At(NamespaceFlags),
        Load(arg(0)),
        Set(CLONE_NEW_ANY, Some(Eperm), Some(Allow)),
    ]);

    program.extend([
        At(Allow),
        Ret(libc::SECCOMP_RET_ALLOW),
        At(Kill),
        Ret(libc::SECCOMP_RET_KILL_PROCESS),
        At(Eacces),
        Ret(errno(libc::EACCES)),
        At(Eperm),
        Ret(errno(libc::EPERM)),
        At(Enosys),
        Ret(errno(libc::ENOSYS)),
    ]);
    Some(assemble(&program))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic-BPF seccomp program the way the kernel would, for the instructions the
    /// filter uses; panics on anything else (an unknown opcode, a jump or load out of range).
    pub(crate) fn evaluate(
        filter: &[libc::sock_filter],
        nr: i64,
        arch: u32,
        args: [u64; 6],
    ) -> u32 {
        let mut data = Vec::with_capacity(std::mem::size_of::<libc::seccomp_data>());
        data.extend_from_slice(&(nr as i32).to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        assert_eq!(data.len(), std::mem::size_of::<libc::seccomp_data>());
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let ins = filter[pc];
            let code = u32::from(ins.code);
            let (jt, jf) = (usize::from(ins.jt), usize::from(ins.jf));
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let at = ins.k as usize;
                    assert!(at.is_multiple_of(4), "unaligned load at {}", pc - 1);
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= ins.k,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += if a == ins.k { jt } else { jf };
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += if a >= ins.k { jt } else { jf };
                }
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => {
                    pc += if a & ins.k != 0 { jt } else { jf };
                }
                c if c == libc::BPF_RET | libc::BPF_K => return ins.k,
                c => panic!("unexpected opcode {c:#x} at {}", pc - 1),
            }
        }
    }

    fn check_well_formed(filter: &[libc::sock_filter]) {
        assert!(filter.len() < 128, "{} instructions", filter.len());
        // What the kernel's checker requires: jumps land inside the program, loads are aligned
        // and inside `struct seccomp_data`, the last instruction returns.
        let ret = (libc::BPF_RET | libc::BPF_K) as u16;
        assert_eq!(filter.last().map(|i| i.code), Some(ret));
        for (pc, ins) in filter.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                let furthest = pc + 1 + usize::from(ins.jt.max(ins.jf));
                assert!(furthest < filter.len(), "jump out of range at {pc}");
            }
            if u32::from(ins.code) == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                let at = ins.k as usize;
                assert!(
                    at.is_multiple_of(4) && at + 4 <= std::mem::size_of::<libc::seccomp_data>()
                );
            }
        }
        // It starts by checking the architecture, before looking at any system call number.
        assert_eq!(
            (filter[0].code, filter[0].k),
            ((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 4)
        );
        assert_eq!(filter[1].k, AUDIT_ARCH.unwrap());
    }

    #[test]
    fn the_filter_is_well_formed() {
        for sockets in [Sockets::None, Sockets::Inet] {
            let Some(filter) = filter(sockets) else {
                assert!(AUDIT_ARCH.is_none());
                return;
            };
            check_well_formed(&filter);
        }
    }

    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const EACCES: u32 = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn foreign_system_calls_are_killed() {
        let Some(filter) = filter(Sockets::Inet) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let unix = libc::AF_UNIX as u64;
        for foreign in [0x4000_0003u32, 0xc000_003e ^ 0xc000_00b7 ^ arch, 0] {
            assert_eq!(evaluate(&filter, libc::SYS_read, foreign, [0; 6]), KILL);
            assert_eq!(
                evaluate(&filter, libc::SYS_socket, foreign, [unix, 1, 0, 0, 0, 0]),
                KILL
            );
        }
        if let Some(x32) = X32_SYSCALL_BIT {
            let x32 = libc::c_long::from(x32);
            let run = |nr, args| evaluate(&filter, nr, arch, args);
            assert_eq!(run(x32 | libc::SYS_socket, [unix, 1, 0, 0, 0, 0]), KILL);
            assert_eq!(run(x32, [0; 6]), KILL);
        }
    }

    #[test]
    fn only_ip_sockets_are_allowed_and_only_when_asked() {
        let (Some(inet), Some(none)) = (filter(Sockets::Inet), filter(Sockets::None)) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        // (A raw socket needs a capability no command has; the filter refuses it first.)
        for (ty, want) in [
            (libc::SOCK_STREAM, ALLOW),
            (libc::SOCK_DGRAM, ALLOW),
            (libc::SOCK_RAW, EACCES),
        ] {
            let ty = ty as u64 | flags;
            for domain in [libc::AF_INET, libc::AF_INET6] {
                let args = [domain as u64, ty, 0, 0, 0, 0];
                assert_eq!(evaluate(&inet, libc::SYS_socket, arch, args), want);
                assert_eq!(evaluate(&none, libc::SYS_socket, arch, args), EACCES);
            }
            for domain in [
                libc::AF_UNIX,
                libc::AF_NETLINK,
                libc::AF_PACKET,
                libc::AF_BLUETOOTH,
                libc::AF_VSOCK,
                libc::AF_ALG,
                0,
            ] {
                let args = [domain as u64, ty, 0, 0, 0, 0];
                assert_eq!(
                    evaluate(&inet, libc::SYS_socket, arch, args),
                    EACCES,
                    "{args:?}"
                );
                assert_eq!(evaluate(&none, libc::SYS_socket, arch, args), EACCES);
            }
        }
        // The high half of the argument is not read by the kernel, nor by the filter:
        // 0x1_0000_0001 is AF_UNIX.
        let sneaky = [0x1_0000_0001, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(evaluate(&inet, libc::SYS_socket, arch, sneaky), EACCES);
        let sneaky = [0xffff_ffff_0000_0000 | libc::AF_INET as u64, 1, 0, 0, 0, 0];
        assert_eq!(evaluate(&inet, libc::SYS_socket, arch, sneaky), ALLOW);
    }

    #[test]
    fn no_mode_with_set_user_or_group_id_is_allowed() {
        let Some(filter) = filter(Sockets::None) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let run = |nr, args| evaluate(&filter, nr, arch, args);
        let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
        let tmpfile = libc::O_TMPFILE as u64 | libc::O_RDWR as u64;
        for (bits, want) in [
            (0o4755, EPERM),
            (0o2755, EPERM),
            (0o6000, EPERM),
            (0o0755, ALLOW),
            (0o1777, ALLOW),
            // The kernel reads a mode from the low 32 bits; so does the filter.
            (0xffff_ffff_0000_0000 | 0o644, ALLOW),
        ] {
            assert_eq!(
                run(libc::SYS_fchmod, [3, bits, 0, 0, 0, 0]),
                want,
                "{bits:o}"
            );
            assert_eq!(run(libc::SYS_fchmodat, [3, 0, bits, 0, 0, 0]), want);
            assert_eq!(run(SYS_FCHMODAT2, [3, 0, bits, 0, 0, 0]), want);
            assert_eq!(run(libc::SYS_mknodat, [3, 0, bits, 0, 0, 0]), want);
            assert_eq!(run(libc::SYS_openat, [3, 0, creat, bits, 0, 0]), want);
            assert_eq!(run(libc::SYS_openat, [3, 0, tmpfile, bits, 0, 0]), want);
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(run(libc::SYS_chmod, [0, bits, 0, 0, 0, 0]), want);
                assert_eq!(run(libc::SYS_creat, [0, bits, 0, 0, 0, 0]), want);
                assert_eq!(run(libc::SYS_mknod, [0, bits, 0, 0, 0, 0]), want);
                assert_eq!(run(libc::SYS_open, [0, creat, bits, 0, 0, 0]), want);
            }
        }
        // Without a flag that creates, the mode argument is whatever the caller left there.
        let read_only = libc::O_RDONLY as u64 | libc::O_CLOEXEC as u64;
        assert_eq!(
            run(libc::SYS_openat, [3, 0, read_only, 0o7777, 0, 0]),
            ALLOW
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(run(libc::SYS_open, [0, read_only, 0o7777, 0, 0, 0]), ALLOW);
        assert_eq!(run(libc::SYS_openat2, [3, 0, 0, 24, 0, 0]), ENOSYS);
    }

    #[test]
    fn only_connected_socketpairs_are_allowed() {
        let Some(filter) = filter(Sockets::None) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let unix = libc::AF_UNIX as u64;
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        for (ty, want) in [
            (stream, ALLOW),
            (stream | flags, ALLOW),
            (libc::SOCK_SEQPACKET as u64 | flags, ALLOW),
            (dgram, EACCES),
            (dgram | flags, EACCES),
            (libc::SOCK_RAW as u64, EACCES),
            (0, EACCES),
            (0xffff_ffff_0000_0000 | stream, ALLOW),
        ] {
            let got = evaluate(&filter, libc::SYS_socketpair, arch, [unix, ty, 0, 0, 0, 0]);
            assert_eq!(got, want, "{ty:#x}");
        }
        // Of another family, even of a type that would be allowed: the kernel made the socket
        // (and loaded its family's module) before it refused the pair.
        for family in [
            libc::AF_TIPC,
            libc::AF_INET,
            libc::AF_RDS,
            libc::AF_VSOCK,
            0,
        ] {
            for ty in [stream, libc::SOCK_SEQPACKET as u64] {
                let got = evaluate(
                    &filter,
                    libc::SYS_socketpair,
                    arch,
                    [family as u64, ty, 0, 0, 0, 0],
                );
                assert_eq!(got, EACCES, "family {family}");
            }
        }
    }

    #[test]
    fn ip_sockets_are_made_with_the_common_protocols_only() {
        let Some(filter) = filter(Sockets::Inet) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        for (family, ty, protocol, want) in [
            (libc::AF_INET, stream, 0, ALLOW),
            (libc::AF_INET6, stream, libc::IPPROTO_TCP, ALLOW),
            (libc::AF_INET, dgram, libc::IPPROTO_UDP, ALLOW),
            (libc::AF_INET, dgram, libc::IPPROTO_ICMP, ALLOW),
            (libc::AF_INET6, dgram, libc::IPPROTO_ICMPV6, ALLOW),
            (libc::AF_INET, stream, libc::IPPROTO_SCTP, EACCES),
            (
                libc::AF_INET6,
                libc::SOCK_SEQPACKET as u64,
                libc::IPPROTO_SCTP,
                EACCES,
            ),
            (libc::AF_INET, dgram, libc::IPPROTO_UDPLITE, EACCES),
            (libc::AF_INET, stream, libc::IPPROTO_MPTCP, EACCES),
            (libc::AF_UNIX, stream, 0, EACCES),
            // The default protocol of another type: SCTP's for a seqpacket (a review found it:
            // protocol 0 passed), DCCP's for its own type (6).
            (libc::AF_INET, libc::SOCK_SEQPACKET as u64, 0, EACCES),
            (libc::AF_INET6, libc::SOCK_SEQPACKET as u64, 0, EACCES),
            (libc::AF_INET, 6, 0, EACCES),
            (
                libc::AF_INET,
                libc::SOCK_RAW as u64,
                libc::IPPROTO_ICMP,
                EACCES,
            ),
            (
                libc::AF_INET,
                stream | (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64,
                0,
                ALLOW,
            ),
        ] {
            let args = [family as u64, ty, protocol as u64, 0, 0, 0];
            let got = evaluate(&filter, libc::SYS_socket, arch, args);
            assert_eq!(got, want, "family {family}, protocol {protocol}");
        }
    }

    #[test]
    fn new_namespaces_io_uring_bpf_and_keys_are_refused() {
        let Some(filter) = filter(Sockets::Inet) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let run = |nr, args| evaluate(&filter, nr, arch, args);
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
            0x80,
        ] {
            let flags = flag as u64 | libc::SIGCHLD as u64;
            assert_eq!(run(libc::SYS_unshare, [flags, 0, 0, 0, 0, 0]), EPERM);
            assert_eq!(run(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), EPERM);
        }
        // fork and threads are clone without namespace flags.
        let fork = libc::SIGCHLD as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(run(libc::SYS_clone, [fork, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            run(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(run(libc::SYS_clone3, [0; 6]), ENOSYS);
        for nr in [
            libc::SYS_setns,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
        ] {
            assert_eq!(run(nr, [8, 0, 0, 0, 0, 0]), EPERM, "{nr}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_connect,
            libc::SYS_sendto,
            libc::SYS_prctl,
            libc::SYS_wait4,
        ] {
            assert_eq!(
                run(nr, [libc::AF_UNIX as u64, 2, 0, 0, 0, 0]),
                ALLOW,
                "{nr}"
            );
        }
    }
}
