//! Unit tests of the buffer engine. The model test (proptest) and the
//! multi-thread stress test are in `tests/integration/ringbuf.rs`; these are
//! small enough for miri (`cargo +nightly miri test --lib ringbuf::`).

use std::sync::Arc;

use super::*;

fn params(chunks: usize, chunk_size: usize, policy: FillPolicy) -> BufferParams {
    BufferParams {
        size_bytes: chunks * chunk_size,
        chunk_size,
        region_chunks: 1,
        policy,
        prefault: false,
    }
}

fn buffer(chunks: usize, chunk_size: usize, policy: FillPolicy) -> Arc<Buffer> {
    Buffer::new(params(chunks, chunk_size, policy)).expect("valid params")
}

#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Packet(Vec<u8>),
    Loss(u32),
}

/// Parses a batch into packets and loss markers; panics on a malformed frame.
fn pieces(batch: &FlushBatch) -> Vec<Piece> {
    let mut out = Vec::new();
    for item in batch.items() {
        match item {
            FlushItem::Loss { writer } => out.push(Piece::Loss(writer.0)),
            FlushItem::Data(d) => {
                let mut records = crate::wire::framing::frames(d);
                out.extend(records.by_ref().map(|r| Piece::Packet(r.packet.to_vec())));
                let end = records.end().expect("walked to the end");
                assert!(
                    end.corruption.is_none() && end.torn_tail.is_none(),
                    "malformed frame: {end:?}"
                );
            }
        }
    }
    out
}

fn drain(b: &Arc<Buffer>) -> Vec<Piece> {
    let batch = b.take_flush();
    let p = pieces(&batch);
    batch.release();
    p
}

fn pkt(tag: u8, len: usize) -> Vec<u8> {
    vec![tag; len]
}

#[test]
fn write_then_flush_round_trips() {
    let b = buffer(4, 256, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    for i in 0..5 {
        w.write_packet(&pkt(i, 10 + usize::from(i))).expect("fits");
    }
    let got = drain(&b);
    let want: Vec<_> = (0..5)
        .map(|i| Piece::Packet(pkt(i, 10 + usize::from(i))))
        .collect();
    assert_eq!(got, want);
    assert!(drain(&b).is_empty(), "no byte twice");
    let s = b.stats();
    assert!(s.is_balanced(), "{s:#?}");
    assert_eq!(s.packets_written, 5);
    assert_eq!(s.packets_read, 5);
    assert_eq!(s.bytes_read, (0..5).map(|i| 2 + 10 + i).sum::<u64>());
}

/// Every length around the short path's copies (each move size, the
/// 127/128 boundary where the header grows to 3 bytes) is stored byte for
/// byte, framed, and counted, with distinct bytes so that a misplaced move
/// shows.
#[test]
fn packets_of_every_short_length_round_trip() {
    let b = buffer(16, 4096, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    let packet = |len: usize| -> Vec<u8> { (0..len).map(|i| (i * 7 + len) as u8).collect() };
    for len in 0..=160 {
        w.write_packet(&packet(len)).expect("fits");
    }
    let got = drain(&b);
    let want: Vec<_> = (0..=160).map(|len| Piece::Packet(packet(len))).collect();
    assert_eq!(got, want);
    let s = b.stats();
    assert!(s.is_balanced(), "{s:#?}");
    let framed: u64 = (0..=160u64).map(|l| l + if l < 128 { 2 } else { 3 }).sum();
    assert_eq!(s.bytes_read, framed);
}

#[test]
fn flush_continues_in_the_writers_chunk() {
    let b = buffer(4, 256, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 20)).expect("fits");
    assert_eq!(drain(&b), vec![Piece::Packet(pkt(1, 20))]);
    w.write_packet(&pkt(2, 20)).expect("fits");
    w.write_packet(&pkt(3, 20)).expect("fits");
    assert_eq!(
        drain(&b),
        vec![Piece::Packet(pkt(2, 20)), Piece::Packet(pkt(3, 20))]
    );
    drop(w);
    assert!(drain(&b).is_empty());
    let s = b.stats();
    assert_eq!(s.chunks_read, 1, "{s:#?}");
    assert_eq!(s.chunks_written, 1);
    assert_eq!(s.bytes_buffered, 0);
}

#[test]
fn writers_are_grouped_in_id_order() {
    let b = buffer(8, 64, FillPolicy::Discard);
    let mut w3 = b.writer(WriterId(3));
    let mut w2 = b.writer(WriterId(2));
    w3.write_packet(&pkt(3, 5)).expect("fits");
    w2.write_packet(&pkt(2, 5)).expect("fits");
    w3.write_packet(&pkt(4, 5)).expect("fits");
    assert_eq!(
        drain(&b),
        vec![
            Piece::Packet(pkt(2, 5)),
            Piece::Packet(pkt(3, 5)),
            Piece::Packet(pkt(4, 5))
        ]
    );
}

#[test]
fn ring_buffer_overwrites_oldest_and_marks_the_loss() {
    let b = buffer(4, 64, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    // 30-byte packets: 2 per chunk; 20 packets = 10 chunks through 4.
    for i in 0..20 {
        w.write_packet(&pkt(i, 30))
            .expect("ring never refuses when nothing is pinned");
    }
    let got = drain(&b);
    assert_eq!(got[0], Piece::Loss(2), "loss marked where the data went");
    let tags: Vec<u8> = got[1..]
        .iter()
        .map(|p| match p {
            Piece::Packet(p) => p[0],
            Piece::Loss(_) => panic!("one loss only"),
        })
        .collect();
    assert_eq!(
        tags,
        (12..20).collect::<Vec<u8>>(),
        "the newest 4 chunks survive"
    );
    let s = b.stats();
    assert!(s.is_balanced(), "{s:#?}");
    assert_eq!(s.chunks_overwritten, 6);
    assert_eq!(s.packets_overwritten, 12);
    assert_eq!(s.bytes_overwritten, 12 * 32);
    assert_eq!(s.write_wrap_count, 2);
}

#[test]
fn discard_drops_while_full_and_resumes_after_a_flush() {
    let b = buffer(2, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    for i in 0..4 {
        w.write_packet(&pkt(i, 30)).expect("room for 4");
    }
    let full = Err(WriteError::Discarded(DiscardReason::Full));
    assert_eq!(w.write_packet(&pkt(9, 30)), full);
    assert_eq!(w.write_packet(&pkt(9, 30)), full);
    let s = b.stats();
    assert_eq!((s.packets_discarded, s.bytes_discarded), (2, 64));
    assert_eq!(s.discarded_full(), (2, 64));
    assert_eq!(
        s.chunks_discarded, 1,
        "the second drop fails fast, unchanged state"
    );
    let got = drain(&b);
    assert_eq!(got.len(), 4);
    // Space is back: accepted again, after a loss marker.
    w.write_packet(&pkt(5, 30))
        .expect("resumes after the flush");
    assert_eq!(drain(&b), vec![Piece::Loss(2), Piece::Packet(pkt(5, 30))]);
    assert_eq!(b.stats().bytes_overwritten, 0);
}

#[test]
fn pinned_chunks_are_not_reused() {
    let b = buffer(3, 64, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 55)).expect("fits");
    w.write_packet(&pkt(2, 55)).expect("fits");
    let held = b.take_flush();
    let before = pieces(&held);
    // Chunks 0 and 1 are pinned: the writer cycles through chunk 2 alone.
    w.write_packet(&pkt(3, 55)).expect("the free chunk");
    w.write_packet(&pkt(4, 55))
        .expect("reuses chunk 2, overwriting 3");
    let held2 = b.take_flush();
    assert_eq!(
        pieces(&held2),
        vec![Piece::Loss(2), Piece::Packet(pkt(4, 55))]
    );
    // Now every chunk is pinned: nothing can be had, and that is the reason.
    assert_eq!(
        w.write_packet(&pkt(5, 55)),
        Err(WriteError::Discarded(DiscardReason::Pinned))
    );
    assert_eq!(pieces(&held), before, "pinned bytes unchanged");
    held.release();
    w.write_packet(&pkt(6, 55))
        .expect("released chunks are free again");
    held2.release();
    assert_eq!(drain(&b), vec![Piece::Loss(2), Piece::Packet(pkt(6, 55))]);
    let s = b.stats();
    assert_eq!(s.packets_discarded, 1);
    assert_eq!(
        (s.packets_discarded_pinned, s.bytes_discarded_pinned),
        (1, 57)
    );
    assert_eq!(s.discarded_full(), (0, 0));
    assert_eq!(s.packets_overwritten, 1);
    assert!(s.is_balanced());
}

#[test]
fn big_packets_span_chunks_and_arrive_whole() {
    let b = buffer(16, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 10)).expect("fits");
    w.write_packet(&pkt(2, 200)).expect("spans 4 chunks");
    w.write_packet(&pkt(3, 10)).expect("fits after it");
    {
        let mut slot = w.begin_packet(150).expect("slot span");
        slot.buf()[..100].fill(4);
        slot.commit(100);
    }
    assert_eq!(
        drain(&b),
        vec![
            Piece::Packet(pkt(1, 10)),
            Piece::Packet(pkt(2, 200)),
            Piece::Packet(pkt(3, 10)),
            Piece::Packet(pkt(4, 100)),
        ]
    );
    assert_eq!(b.max_packet_len(), 256, "a quarter of a 1 KiB buffer");
    assert_eq!(w.write_packet(&pkt(5, 257)), Err(WriteError::TooBig));
    assert!(matches!(w.begin_packet(257), Err(WriteError::TooBig)));
    let s = b.stats();
    assert_eq!(s.packets_refused, 2);
    assert!(s.is_balanced());
}

#[test]
fn an_overwritten_span_loses_its_packet_whole() {
    let b = buffer(16, 64, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 150)).expect("span of 3");
    for i in 2..40 {
        w.write_packet(&pkt(i, 55)).expect("single chunks");
    }
    let got = drain(&b);
    assert_eq!(got[0], Piece::Loss(2));
    assert!(
        !got.iter()
            .any(|p| matches!(p, Piece::Packet(p) if p[0] == 1)),
        "the big packet is lost whole, not in part"
    );
    let s = b.stats();
    assert!(s.is_balanced(), "{s:#?}");
}

#[test]
fn slot_dropped_uncommitted_writes_nothing() {
    let b = buffer(4, 64, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    {
        let mut slot = w.begin_packet(20).expect("fits");
        slot.buf().fill(9);
    }
    w.write_packet(&pkt(1, 5)).expect("fits");
    assert_eq!(drain(&b), vec![Piece::Packet(pkt(1, 5))]);
}

#[test]
fn snapshot_does_not_consume() {
    let b = buffer(4, 64, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 10)).expect("fits");
    let snap = b.snapshot();
    assert_eq!(pieces(&snap), vec![Piece::Packet(pkt(1, 10))]);
    snap.release();
    assert_eq!(b.stats().bytes_read, 0);
    assert_eq!(drain(&b), vec![Piece::Packet(pkt(1, 10))]);
}

#[test]
fn clear_drops_unflushed_data_and_marks_it() {
    let b = buffer(4, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 10)).expect("fits");
    w.write_packet(&pkt(2, 60)).expect("next chunk");
    b.clear();
    let s = b.stats();
    assert_eq!((s.packets_cleared, s.bytes_cleared), (2, 74));
    assert_eq!(s.bytes_buffered, 0);
    assert!(s.is_balanced());
    assert!(drain(&b).is_empty(), "no marker until data follows");
    w.write_packet(&pkt(3, 10)).expect("fits");
    assert_eq!(drain(&b), vec![Piece::Loss(2), Piece::Packet(pkt(3, 10))]);
}

#[test]
fn dropping_a_writer_commits_and_flush_hands_over() {
    let b = buffer(4, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 10)).expect("fits");
    w.flush();
    w.write_packet(&pkt(2, 10)).expect("a new chunk");
    drop(w);
    let s = b.stats();
    assert_eq!(s.chunks_written, 2);
    assert_eq!(s.unused_chunk_bytes, 2 * (64 - 12));
    assert_eq!(
        drain(&b),
        vec![Piece::Packet(pkt(1, 10)), Piece::Packet(pkt(2, 10))]
    );
}

#[test]
fn a_dead_writers_trailing_loss_is_marked_once() {
    let b = buffer(2, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 55)).expect("fits");
    w.write_packet(&pkt(2, 55)).expect("fits");
    assert_eq!(
        w.write_packet(&pkt(3, 55)),
        Err(WriteError::Discarded(DiscardReason::Full))
    );
    drop(w);
    assert_eq!(
        drain(&b),
        vec![
            Piece::Packet(pkt(1, 55)),
            Piece::Packet(pkt(2, 55)),
            Piece::Loss(2)
        ]
    );
    assert!(drain(&b).is_empty());
}

#[test]
fn params_are_checked() {
    assert!(matches!(
        Buffer::new(params(1, 4096, FillPolicy::Discard)),
        Err(RingbufError::TooSmall { .. })
    ));
    assert!(matches!(
        Buffer::new(params(4, 8, FillPolicy::Discard)),
        Err(RingbufError::ChunkSize { .. })
    ));
    assert!(matches!(
        Buffer::new(BufferParams {
            region_chunks: 0,
            ..params(4, 64, FillPolicy::Discard)
        }),
        Err(RingbufError::RegionChunks)
    ));
    let p = BufferParams::new(16 * 1024, FillPolicy::RingBuffer);
    assert_eq!(
        (p.chunk_size, p.region_chunks),
        (256, 16),
        "small buffers get smaller chunks, and regions of a quarter"
    );
    let p = BufferParams::new(4096, FillPolicy::Discard);
    assert_eq!((p.chunk_size, p.region_chunks), (256, 4));
    let p = BufferParams::new(1 << 20, FillPolicy::Discard);
    assert_eq!((p.chunk_size, p.region_chunks), (4096, 16));
    let p = BufferParams::new(64 << 20, FillPolicy::RingBuffer);
    assert_eq!(p.chunk_size, BufferParams::DEFAULT_CHUNK_SIZE);
    assert_eq!(
        p.chunk_size * p.region_chunks,
        BufferParams::DEFAULT_REGION_BYTES
    );
    let b = Buffer::new(params(3, 1000, FillPolicy::Discard)).expect("valid");
    assert_eq!(b.size_bytes(), 3000);
    // Two header pages, two meta pages, the live page, one page of chunk
    // table and one of chunks: page-rounded areas (`layout`).
    assert_eq!(b.mapped_bytes(), 7 * 4096, "page-rounded areas");
    assert_eq!(b.chunk_count(), 3);
    assert_eq!(b.stats().buffer_size, 3000);
}

#[test]
#[cfg_attr(miri, ignore = "mmap and madvise are not available under miri")]
fn prefaulted_buffer_maps() {
    let b = Buffer::new(BufferParams::new(1 << 20, FillPolicy::RingBuffer)).expect("1 MiB");
    let mut w = b.writer(WriterId(2));
    w.write_packet(&[1, 2, 3]).expect("fits");
    assert_eq!(drain(&b), vec![Piece::Packet(vec![1, 2, 3])]);
}

#[test]
fn threads_write_while_the_flusher_drains() {
    let (threads, per) = if cfg!(miri) { (2, 40) } else { (3, 3000) };
    let b = buffer(8, 128, FillPolicy::RingBuffer);
    let handles: Vec<_> = (0..threads)
        .map(|t: u8| {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let mut w = b.writer(WriterId(u32::from(t)));
                let mut ok = 0u64;
                for n in 0..per {
                    let mut p = vec![t; 8 + n % 40];
                    p[1..5].copy_from_slice(&(n as u32).to_le_bytes());
                    if w.write_packet(&p).is_ok() {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut last = vec![None::<u32>; usize::from(threads)];
    let mut seen = 0u64;
    let mut check = |batch: &FlushBatch| {
        for piece in pieces(batch) {
            if let Piece::Packet(p) = piece {
                let t = usize::from(p[0]);
                let n = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
                assert!(p[5..].iter().all(|&x| x == p[0]), "R1: intact");
                assert!(last[t].is_none_or(|l| n > l), "R2: in order, none twice");
                last[t] = Some(n);
                seen += 1;
            }
        }
    };
    while !handles.iter().all(|h| h.is_finished()) {
        let batch = b.take_flush();
        check(&batch);
        batch.release();
    }
    let ok: u64 = handles.into_iter().map(|h| h.join().expect("writer")).sum();
    let batch = b.take_flush();
    check(&batch);
    batch.release();
    let s = b.stats();
    assert!(s.is_balanced(), "{s:#?}");
    assert_eq!(s.packets_written, ok);
    assert_eq!(ok, seen + s.packets_overwritten);
    assert_eq!(s.bytes_buffered, 0);
}

#[test]
fn shared_types_cross_threads() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Arc<Buffer>>();
    sync::<Buffer>();
    send::<Writer>();
    send::<FlushBatch>();
}

#[test]
fn a_batch_dropped_unreleased_still_unpins() {
    let b = buffer(2, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    w.write_packet(&pkt(1, 55)).expect("fits");
    w.write_packet(&pkt(2, 55)).expect("fits");
    drop(b.take_flush());
    w.write_packet(&pkt(3, 55)).expect("freed by the drop");
}

#[test]
fn a_slot_dropped_without_commit_stores_nothing() {
    let b = buffer(4, 256, FillPolicy::RingBuffer);
    let mut w = b.writer(WriterId(3));
    let mut slot = w.begin_packet(20).expect("room");
    slot.buf()[..3].copy_from_slice(&[7, 8, 9]);
    slot.commit(3);
    let _ = w.begin_packet(10).expect("room");
    let _ = w.begin_packet_at_least(5, 10).expect("room");
    w.write_packet(&[1]).expect("fits");
    assert_eq!(
        drain(&b),
        vec![Piece::Packet(vec![7, 8, 9]), Piece::Packet(vec![1])]
    );
    assert!(b.stats().is_balanced());
}

#[test]
fn slot_headers_are_as_wide_as_the_reserved_length() {
    for (max_len, width) in [
        (0, 2),
        (127, 2),
        (128, 3),
        (16_383, 3),
        (16_384, 4),
        ((1 << 21) - 1, 4),
        (1 << 21, 5),
        ((1 << 28) - 1, 5),
    ] {
        assert_eq!(slot_header_bytes(max_len), width, "max_len {max_len}");
    }
    assert!(slot_header_bytes((1 << 28) - 1) <= MAX_SLOT_HEADER_BYTES);
    // Each width, committed short and full: the frame holds the exact length
    // in a varint of the reserved width, right before the packet.
    let b = buffer(4, 64 * 1024, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    let mut want = Vec::new();
    let mut bytes = 0;
    for (i, (max_len, len)) in [(100, 100), (100, 3), (1000, 1000), (1000, 5), (20_000, 7)]
        .into_iter()
        .enumerate()
    {
        let mut slot = w.begin_packet(max_len).expect("fits");
        slot.buf()[..len].fill(i as u8);
        slot.commit(len);
        want.push(Piece::Packet(pkt(i as u8, len)));
        bytes += slot_header_bytes(max_len) + len;
    }
    let batch = b.take_flush();
    let raw: Vec<u8> = batch
        .items()
        .flat_map(|i| match i {
            FlushItem::Data(d) => d.to_vec(),
            FlushItem::Loss { .. } => Vec::new(),
        })
        .collect();
    assert_eq!(pieces(&batch), want);
    batch.release();
    assert_eq!(raw.len(), bytes);
    assert_eq!(&raw[..3], &[0x0A, 100, 0], "2-byte header, 100 B");
    assert_eq!(&raw[102..104], &[0x0A, 3], "2-byte header, 3 B");
    assert_eq!(&raw[107..110], &[0x0A, 0xE8, 0x07], "3-byte header, 1000 B");
    assert_eq!(&raw[1110..1113], &[0x0A, 0x85, 0x00], "3-byte header, 5 B");
    assert_eq!(&raw[1118..1122], &[0x0A, 0x87, 0x80, 0x00], "4-byte header");
    let s = b.stats();
    assert_eq!(s.bytes_written, bytes as u64);
    assert!(s.is_balanced());
}

#[test]
#[cfg_attr(miri, ignore = "a 4 MiB slot is slow to retag under miri")]
fn five_byte_slot_headers_for_slots_of_2_mib_and_more() {
    let b = buffer(2, 4 << 20, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    let mut slot = w.begin_packet(3 << 20).expect("fits a chunk");
    slot.buf()[..9].fill(4);
    slot.commit(9);
    let batch = b.take_flush();
    let data: Vec<&[u8]> = batch
        .items()
        .filter_map(|i| match i {
            FlushItem::Data(d) => Some(d),
            FlushItem::Loss { .. } => None,
        })
        .collect();
    assert_eq!(
        data,
        vec![&[0x0A, 0x89, 0x80, 0x80, 0x00, 4, 4, 4, 4, 4, 4, 4, 4, 4][..]]
    );
}

#[test]
fn begin_packet_at_least_uses_up_the_region_before_taking_a_new_one() {
    let b = buffer(4, 256, FillPolicy::Discard);
    assert_eq!(b.max_packet_len(), 256);
    let mut w = b.writer(WriterId(2));
    // No region yet: a new one, the whole max_len.
    let mut slot = w.begin_packet_at_least(10, 100).expect("room");
    assert_eq!(slot.buf().len(), 100);
    slot.buf()[..50].fill(1);
    slot.commit(50);
    // 256 - 52 = 204 B left: 201 B of space behind a 3-byte header, the
    // max_len above max_packet_len lowered to it.
    let mut slot = w.begin_packet_at_least(10, 1000).expect("room");
    assert_eq!(slot.buf().len(), 201);
    slot.buf().fill(2);
    slot.commit(201);
    // Nothing left: a new region for the whole max_len.
    let mut slot = w.begin_packet_at_least(10, 20).expect("room");
    assert_eq!(slot.buf().len(), 20);
    slot.buf()[..5].fill(3);
    slot.commit(5);
    // 249 B left but 250 asked at least: a new region.
    let mut slot = w.begin_packet_at_least(250, 250).expect("room");
    assert_eq!(slot.buf().len(), 250);
    slot.buf().fill(4);
    slot.commit(250);
    // At least more than any packet: refused, counted.
    assert_eq!(
        w.begin_packet_at_least(300, 400)
            .map(|mut s| s.buf().len())
            .err(),
        Some(WriteError::TooBig)
    );
    w.flush();
    let s = b.stats();
    assert_eq!(s.chunks_written, 3);
    assert_eq!(
        s.unused_chunk_bytes,
        249 + 3,
        "only the chunk left for the 250 B and the last one's tail"
    );
    assert_eq!(s.packets_refused, 1);
    assert_eq!(
        drain(&b),
        vec![
            Piece::Packet(pkt(1, 50)),
            Piece::Packet(pkt(2, 201)),
            Piece::Packet(pkt(3, 5)),
            Piece::Packet(pkt(4, 250)),
        ]
    );
}

/// 40 writers, one small packet each, into a buffer of 1 MiB (256 chunks of
/// 4 KiB, regions of 64 KiB): every writer gets a share, none is dropped.
fn many_writers_one_packet_each(policy: FillPolicy) {
    const WRITERS: u32 = 40;
    let b = Buffer::new(BufferParams {
        prefault: false,
        ..BufferParams::new(1 << 20, policy)
    })
    .expect("1 MiB");
    let mut writers: Vec<Writer> = (1..=WRITERS).map(|i| b.writer(WriterId(i))).collect();
    for (i, w) in writers.iter_mut().enumerate() {
        w.write_packet(&pkt(i as u8, 100))
            .unwrap_or_else(|e| panic!("writer {i}: {e}"));
    }
    let held: usize = writers.iter().map(Writer::region_bytes).sum();
    assert!(held < 1 << 20, "{held} bytes held: some room stays free");
    let s = b.stats();
    assert_eq!((s.packets_written, s.packets_discarded), (40, 0));
    let got = drain(&b);
    assert_eq!(got.len(), 40, "every writer's packet is kept");
    // A few writers that attach later, while the first ones still hold
    // their regions, find the room those left.
    let mut late: Vec<Writer> = (WRITERS + 1..=WRITERS + 10)
        .map(|i| b.writer(WriterId(i)))
        .collect();
    for w in &mut late {
        w.write_packet(&pkt(7, 100))
            .expect("room for a late writer");
    }
    assert_eq!(drain(&b).len(), 10);
    assert!(b.stats().is_balanced());
}

#[test]
fn more_writers_than_regions_each_get_a_share_ring_buffer() {
    many_writers_one_packet_each(FillPolicy::RingBuffer);
}

#[test]
fn more_writers_than_regions_each_get_a_share_discard() {
    many_writers_one_packet_each(FillPolicy::Discard);
}

#[test]
fn a_lone_writer_takes_whole_regions() {
    let b = Buffer::new(BufferParams {
        prefault: false,
        ..BufferParams::new(1 << 20, FillPolicy::RingBuffer)
    })
    .expect("1 MiB");
    let mut w = b.writer(WriterId(1));
    w.write_packet(&pkt(1, 10)).expect("fits");
    assert_eq!(w.region_bytes(), BufferParams::DEFAULT_REGION_BYTES);
}

/// A write pass holds part of the buffer: writers keep writing into the
/// rest, under either policy, and no drop is blamed on the pass.
fn not_refused_during_a_pass(policy: FillPolicy) {
    let b = Buffer::new(BufferParams {
        prefault: false,
        ..BufferParams::new(1 << 20, policy)
    })
    .expect("1 MiB");
    let mut w = b.writer(WriterId(1));
    // A quarter of the buffer, then a pass takes it and stays in flight.
    for i in 0..256 {
        w.write_packet(&pkt(i as u8, 1000)).expect("room");
    }
    let pass = b.take_flush();
    let before = pieces(&pass);
    // Another half of the buffer while the pass is in flight.
    for i in 0..512 {
        w.write_packet(&pkt(i as u8, 1000))
            .expect("room while a pass is in flight");
    }
    assert_eq!(pieces(&pass), before, "the pass's bytes are untouched");
    let s = b.stats();
    assert_eq!((s.packets_discarded, s.packets_overwritten), (0, 0));
    pass.release();
    assert_eq!(drain(&b).len(), 512);
}

#[test]
fn a_writer_is_not_refused_while_a_pass_is_in_flight_ring_buffer() {
    not_refused_during_a_pass(FillPolicy::RingBuffer);
}

#[test]
fn a_writer_is_not_refused_while_a_pass_is_in_flight_discard() {
    not_refused_during_a_pass(FillPolicy::Discard);
}

#[test]
fn refusals_name_their_reason() {
    // Two chunks, three writers: the third finds every chunk held.
    let b = buffer(2, 64, FillPolicy::RingBuffer);
    let (mut w1, mut w2, mut w3) = (
        b.writer(WriterId(1)),
        b.writer(WriterId(2)),
        b.writer(WriterId(3)),
    );
    w1.write_packet(&pkt(1, 10)).expect("a chunk");
    w2.write_packet(&pkt(2, 10)).expect("a chunk");
    assert_eq!(
        w3.write_packet(&pkt(3, 10)),
        Err(WriteError::Discarded(DiscardReason::HeldByWriters))
    );
    let s = b.stats();
    assert_eq!((s.packets_discarded_held, s.bytes_discarded_held), (1, 12));
    assert_eq!(s.discarded_full(), (0, 0));
}

#[test]
fn discard_says_full_only_when_unread_data_fills_the_chunks() {
    // Four chunks, DISCARD. One writer's data is done and unread; three
    // writers hold a chunk each: a fifth writer is refused because writers
    // hold the chunks, not because the buffer is full.
    let b = buffer(4, 64, FillPolicy::Discard);
    let mut done = b.writer(WriterId(1));
    done.write_packet(&pkt(1, 40)).expect("a chunk");
    drop(done);
    let mut held: Vec<Writer> = (2..5).map(|i| b.writer(WriterId(i))).collect();
    for (i, w) in held.iter_mut().enumerate() {
        w.write_packet(&pkt(i as u8, 40)).expect("a chunk");
    }
    let mut late = b.writer(WriterId(9));
    assert_eq!(
        late.write_packet(&pkt(9, 10)),
        Err(WriteError::Discarded(DiscardReason::HeldByWriters))
    );
    assert_eq!(b.stats().discarded_full(), (0, 0));
    // Once the holders' data is done and unread too, the buffer is full.
    drop(held);
    assert_eq!(
        late.write_packet(&pkt(9, 10)),
        Err(WriteError::Discarded(DiscardReason::Full))
    );
}

#[test]
fn many_writers_on_few_chunks_are_not_called_a_full_buffer() {
    // Eight chunks of 64 B, DISCARD, eight writers done with 12 bytes each:
    // every chunk is taken, but the buffer holds 96 of its 512 bytes. The
    // ninth writer is refused because other writers took the chunks.
    let b = buffer(8, 64, FillPolicy::Discard);
    for i in 1..=8u32 {
        let mut w = b.writer(WriterId(i));
        w.write_packet(&pkt(i as u8, 10)).expect("a chunk");
    }
    let mut late = b.writer(WriterId(9));
    assert_eq!(
        late.write_packet(&pkt(9, 10)),
        Err(WriteError::Discarded(DiscardReason::HeldByWriters))
    );
    let s = b.stats();
    assert_eq!(s.discarded_full(), (0, 0));
    assert_eq!((s.packets_discarded_held, s.bytes_discarded_held), (1, 12));
}

#[test]
fn a_batch_lets_go_of_its_regions_as_their_bytes_are_written() {
    // 4 chunks of 64 B, DISCARD: every region a chunk, each holding one
    // 55-byte packet (57 framed bytes).
    let b = buffer(4, 64, FillPolicy::Discard);
    let mut w = b.writer(WriterId(2));
    for i in 0..4 {
        w.write_packet(&pkt(i, 55)).expect("fits");
    }
    assert_eq!(
        w.write_packet(&pkt(9, 55)),
        Err(WriteError::Discarded(DiscardReason::Full))
    );
    let batch = b.take_flush();
    assert_eq!(batch.len_bytes(), 4 * 57);
    // While the whole batch is pinned, the refusal says so.
    assert_eq!(
        w.write_packet(&pkt(9, 55)),
        Err(WriteError::Discarded(DiscardReason::Pinned))
    );
    // SAFETY: M4 — this test reads the batch's bytes only below, and only
    // what is still pinned.
    let released = unsafe { batch.release_written(56) };
    assert_eq!(released, 0, "no region whole yet");
    // SAFETY: M4 — as above.
    assert_eq!(unsafe { batch.release_written(57 + 10) }, 57);
    assert_eq!(batch.released_through(), 57);
    w.write_packet(&pkt(5, 55))
        .expect("the written region is free again");
    assert_eq!(
        w.write_packet(&pkt(6, 55)),
        Err(WriteError::Discarded(DiscardReason::Pinned)),
        "the rest is still in the pass"
    );
    // The unreleased part reads as it was.
    let Some(FlushItem::Data(last)) = batch.items().last() else {
        panic!("data");
    };
    assert_eq!(&last[last.len() - 55..], &pkt(3, 55)[..]);
    // SAFETY: M4 — nothing of the batch is read after this.
    assert_eq!(unsafe { batch.release_written(4 * 57) }, 4 * 57);
    drop(batch);
    w.write_packet(&pkt(7, 55)).expect("all let go of");
    let s = b.stats();
    assert_eq!(s.packets_discarded_pinned, 2);
    assert_eq!(s.packets_discarded, 3);
    assert!(s.is_balanced());
    assert_eq!(
        drain(&b),
        vec![
            Piece::Loss(2),
            Piece::Packet(pkt(5, 55)),
            Piece::Loss(2),
            Piece::Packet(pkt(7, 55))
        ]
    );
}
