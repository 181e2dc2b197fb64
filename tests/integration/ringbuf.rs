//! The buffer engine: the model test (proptest, the same oracle as the
//! `ringbuf_model` fuzz target), a multi-thread stress test with numbered,
//! checksummed packets, and the memory footprint of a prefaulted buffer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;
use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriteError, WriterId};

#[path = "../../fuzz/src/ringbuf_model.rs"]
#[allow(dead_code)] // the fuzz entry points are unused here
mod ringbuf_model;

use ringbuf_model::{Op, Setup, frames};

fn setup_strategy() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(FillPolicy::RingBuffer), Just(FillPolicy::Discard)],
        // 64 KiB chunks hold slots of 16 KiB and more: 4-byte slot headers
        // (the smaller chunks see the 2- and 3-byte ones).
        prop_oneof![
            4 => prop_oneof![Just(16usize), Just(64), Just(256), Just(1024)],
            1 => Just(64 * 1024),
        ],
        2usize..12,
        prop_oneof![2 => Just(1usize), 1 => Just(2), 1 => Just(4)],
    )
        .prop_map(|(policy, chunk_size, chunks, region_chunks)| Setup {
            policy,
            chunk_size,
            // Few big chunks: the payloads are checked byte by byte.
            chunks: if chunk_size > 1024 {
                chunks.min(4)
            } else {
                chunks
            },
            region_chunks,
        })
}

fn len_strategy(chunk: usize) -> impl Strategy<Value = u32> {
    let chunk = chunk as u32;
    prop_oneof![
        6 => 0u32..48,
        3 => 0u32..2 * chunk,
        1 => 0u32..6 * chunk,
    ]
}

fn op_strategy(chunk: usize) -> impl Strategy<Value = Op> {
    let w = 0u8..ringbuf_model::WRITERS as u8;
    prop_oneof![
        12 => (w.clone(), len_strategy(chunk)).prop_map(|(writer, len)| Op::Write { writer, len }),
        3 => (w.clone(), len_strategy(chunk), 0u32..8, any::<bool>()).prop_map(
            |(writer, max_len, back, commit)| Op::Slot {
                writer,
                max_len,
                len: if commit { max_len.saturating_sub(back) } else { u32::MAX },
            }
        ),
        3 => (w.clone(), len_strategy(chunk), len_strategy(chunk), prop_oneof![0u32..8, Just(u32::MAX)]).prop_map(
            |(writer, min_len, max_len, back)| Op::Reserve { writer, min_len, max_len, back }
        ),
        1 => w.clone().prop_map(|writer| Op::Flush { writer }),
        1 => w.prop_map(|writer| Op::Drop { writer }),
        2 => Just(Op::Take),
        2 => Just(Op::Drain),
        1 => Just(Op::Snapshot),
        2 => any::<u8>().prop_map(|which| Op::Release { which }),
        1 => Just(Op::Clear),
    ]
}

fn case_strategy() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    setup_strategy().prop_flat_map(|s| {
        (
            Just(s),
            prop::collection::vec(op_strategy(s.chunk_size), 0..200),
        )
    })
}

/// Only writes and flushes of several writers into a RING_BUFFER with
/// regions of several chunks, then one drain: wraps with regions of mixed
/// sizes, where W3 (overwrite oldest first) is at stake.
fn wrap_case_strategy() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (prop_oneof![Just(16usize), Just(64)], 3usize..12, 2usize..5).prop_flat_map(
        |(chunk_size, chunks, region_chunks)| {
            let setup = Setup {
                policy: FillPolicy::RingBuffer,
                chunk_size,
                chunks,
                region_chunks,
            };
            let w = 0u8..ringbuf_model::WRITERS as u8;
            let op = prop_oneof![
                12 => (w.clone(), 0u32..2 * chunk_size as u32)
                    .prop_map(|(writer, len)| Op::Write { writer, len }),
                1 => w.prop_map(|writer| Op::Flush { writer }),
            ];
            (Just(setup), prop::collection::vec(op, 0..300))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// W3 where it matters: many wraps, no pass until the end.
    #[test]
    fn ring_buffer_keeps_one_newest_run_per_writer((setup, ops) in wrap_case_strategy()) {
        ringbuf_model::run(setup, &ops);
    }

    /// R1–R3 and pinning, after every step, both policies, several chunk sizes.
    #[test]
    fn ringbuf_model_holds((setup, ops) in case_strategy()) {
        ringbuf_model::run(setup, &ops);
    }
}

/// Packet `n` of writer `w`: [w u32][n u64][len-16 bytes of fill][checksum u32].
fn stress_packet(w: u32, n: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(w);
    while out.len() < len - 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    let sum = checksum(out);
    out.extend_from_slice(&sum.to_le_bytes());
}

fn checksum(b: &[u8]) -> u32 {
    b.iter().fold(0x811C_9DC5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    })
}

fn stress(policy: FillPolicy) {
    const THREADS: u32 = 4;
    let per_thread: u64 = if cfg!(debug_assertions) {
        40_000
    } else {
        400_000
    };
    let params = BufferParams {
        size_bytes: 256 * 1024,
        chunk_size: 4096,
        region_chunks: 4,
        policy,
        prefault: true,
    };
    let buffer = Buffer::new(params).expect("valid params");
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let buffer = Arc::clone(&buffer);
            std::thread::spawn(move || {
                let mut w = buffer.writer(WriterId(t + 2));
                let mut p = Vec::new();
                let (mut ok, mut dropped) = (0u64, 0u64);
                for n in 0..per_thread {
                    // Mostly small, some spanning several chunks.
                    let len = match n % 97 {
                        0 => 9000,
                        1..=5 => 1500,
                        _ => 20 + (n as usize * 7) % 200,
                    };
                    stress_packet(t, n, len, &mut p);
                    let r = if n % 3 == 0 {
                        w.begin_packet(len).map(|mut slot| {
                            slot.buf().copy_from_slice(&p);
                            slot.commit(len);
                        })
                    } else {
                        w.write_packet(&p)
                    };
                    match r {
                        Ok(()) => ok += 1,
                        Err(WriteError::Discarded(_)) => dropped += 1,
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (ok, dropped)
            })
        })
        .collect();
    // The flusher: drains while the writers run, holding each batch a little
    // while (as the I/O would) before releasing it.
    let flusher = {
        let buffer = Arc::clone(&buffer);
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut last: BTreeMap<u32, u64> = BTreeMap::new();
            let mut seen = 0u64;
            let mut losses = 0u64;
            let mut pending_loss: BTreeMap<u32, bool> = BTreeMap::new();
            loop {
                let finished = done.load(Ordering::Acquire);
                let batch = buffer.take_flush();
                for item in batch.items() {
                    match item {
                        FlushItem::Loss { writer } => {
                            losses += 1;
                            pending_loss.insert(writer.0 - 2, true);
                        }
                        FlushItem::Data(d) => {
                            for (p, _) in frames(d) {
                                let (body, sum) = p.split_at(p.len() - 4);
                                assert_eq!(checksum(body).to_le_bytes(), sum, "R1: corrupt packet");
                                let w = u32::from_le_bytes(body[0..4].try_into().expect("4 bytes"));
                                let n =
                                    u64::from_le_bytes(body[4..12].try_into().expect("8 bytes"));
                                let gap = match last.get(&w) {
                                    Some(&prev) => {
                                        assert!(n > prev, "R2: writer {w}: {n} after {prev}");
                                        n != prev + 1
                                    }
                                    None => n != 0,
                                };
                                let marked = pending_loss.remove(&w).unwrap_or(false);
                                assert!(!gap || marked, "writer {w}: gap before {n} not marked");
                                last.insert(w, n);
                                seen += 1;
                            }
                        }
                    }
                }
                std::thread::yield_now();
                batch.release();
                if finished {
                    return (seen, losses);
                }
            }
        })
    };
    let mut ok = 0;
    let mut dropped = 0;
    for h in writers {
        let (o, d) = h.join().expect("writer thread");
        ok += o;
        dropped += d;
    }
    done.store(true, Ordering::Release);
    let (seen, losses) = flusher.join().expect("flusher thread");
    let s = buffer.stats();
    assert!(s.is_balanced(), "R3: {s:#?}");
    assert_eq!(s.bytes_buffered, 0, "everything drained: {s:#?}");
    assert_eq!(s.packets_written, ok);
    assert_eq!(s.packets_read, seen);
    assert_eq!(s.packets_discarded, dropped);
    assert_eq!(
        ok,
        seen + s.packets_overwritten,
        "R3: every packet read or counted lost"
    );
    if policy == FillPolicy::Discard {
        assert_eq!(s.packets_overwritten, 0);
    }
    if s.packets_overwritten + s.packets_discarded > 0 {
        assert!(losses > 0, "data was lost but never marked");
    }
}

#[test]
fn ringbuf_stress_ring_buffer() {
    stress(FillPolicy::RingBuffer);
}

#[test]
fn ringbuf_stress_discard() {
    stress(FillPolicy::Discard);
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A prefaulted 64 MiB buffer is resident at once, and writing through it
/// (many laps of the ring) does not grow the process. The process's RSS is
/// this test's own only when nothing else runs in it: the test runs itself
/// again, alone, in a child process.
#[test]
fn ringbuf_prefault_rss() {
    const ALONE: &str = "RECORDER_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let name = "ringbuf::ringbuf_prefault_rss";
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", name, "--test-threads", "1"])
            .env(ALONE, "1")
            .output()
            .expect("runs the test alone");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    const SIZE: usize = 64 << 20;
    let Some(before) = rss_bytes() else {
        eprintln!("skipped: no /proc/self/status");
        return;
    };
    let buffer = Buffer::new(BufferParams::new(SIZE, FillPolicy::RingBuffer)).expect("64 MiB");
    let after_map = rss_bytes().expect("readable");
    let grown = after_map.saturating_sub(before);
    assert!(
        grown >= SIZE as u64 * 95 / 100,
        "prefault made only {grown} bytes resident"
    );
    let mut w = buffer.writer(WriterId(2));
    let p = vec![7u8; 1000];
    for _ in 0..(3 * SIZE / 1000) {
        w.write_packet(&p)
            .expect("ring never refuses a small packet when nothing is pinned");
    }
    drop(w);
    let after_laps = rss_bytes().expect("readable");
    assert!(
        after_laps <= after_map + (4 << 20),
        "RSS grew from {after_map} to {after_laps} while writing"
    );
    assert!(buffer.stats().write_wrap_count >= 2);
}
