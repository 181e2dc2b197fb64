//! Writes the `ring_image` target's seed corpus: small ring files as the
//! engine makes them, and damaged copies. Run again after a change to the
//! ring layout:
//! `cargo test --manifest-path fuzz/Cargo.toml --test ring_image_seeds -- --ignored`.

use std::path::Path;

use recorder::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};

fn packet(seq: u32, n: u16) -> Vec<u8> {
    // trusted_packet_sequence_id, then a for_testing-like body.
    let [lo, hi] = n.to_le_bytes();
    let mut p = vec![0x50, seq as u8];
    p.extend_from_slice(&[0xA2, 0x38, 4, 0x18, lo, hi & 0x7f, 0]);
    p
}

fn bytes_of(b: &Buffer) -> Vec<u8> {
    use recorder::ringbuf::image::ReadAt;
    let fd = b.shared_file().expect("shared");
    let len = fd.size().expect("size") as usize;
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = fd.read_at(&mut out[at..], at as u64).expect("read");
        assert!(n > 0);
        at += n;
    }
    out
}

fn ring(chunks: usize) -> std::sync::Arc<Buffer> {
    let params = BufferParams {
        size_bytes: chunks * 256,
        chunk_size: 256,
        region_chunks: 2,
        policy: FillPolicy::RingBuffer,
        prefault: false,
    };
    let identity = RingIdentity {
        count: 1,
        uuid: (1, 2),
        uid: 1000,
        pid: 4242,
        clocks: vec![(6, 1_000_000), (1, 1_700_000_000_000_000_000)],
        config: vec![0x0A, 0x03, 0x08, 0x80, 0x08],
        ..RingIdentity::default()
    };
    Buffer::create(params, Backing::Memfd, &identity).expect("memfd ring")
}

#[test]
#[ignore = "writes the corpus; run by hand"]
fn write_ring_image_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/ring_image");
    std::fs::create_dir_all(&dir).expect("corpus dir");
    let save = |name: &str, data: &[u8]| std::fs::write(dir.join(name), data).expect("write");

    // Two writers, a pass that took some, both still holding a region.
    let b = ring(16);
    let mut w2 = b.writer(WriterId(2));
    let mut w3 = b.writer(WriterId(3));
    for n in 0..60 {
        w2.write_packet(&packet(2, n)).expect("fits");
        if n % 3 == 0 {
            w3.write_packet(&packet(3, n)).expect("fits");
        }
    }
    b.take_flush().release();
    for n in 60..70 {
        w2.write_packet(&packet(2, n)).expect("fits");
    }
    let valid = bytes_of(&b);
    save("two_writers", &valid);

    // A pass in flight at the moment of the copy.
    let pass = b.take_flush();
    w2.write_packet(&packet(2, 70)).expect("fits");
    save("pass_in_flight", &bytes_of(&b));
    drop(pass);
    drop((w2, w3));

    // Overwritten: a loss marker before the newest run.
    let b = ring(8);
    let mut w = b.writer(WriterId(2));
    for n in 0..400 {
        w.write_packet(&packet(2, n)).expect("fits");
    }
    drop(w);
    let wrapped = bytes_of(&b);
    save("wrapped", &wrapped);

    // Damage: chunk bytes, the first header copy, a table entry mid-update,
    // a truncated file, and nothing at all.
    let data_at = {
        let h = recorder::ringbuf::layout::CoreHeader::decode(&valid).expect("header");
        (h.data as usize, h.table as usize)
    };
    let mut d = valid.clone();
    d[data_at.0 + 20..data_at.0 + 60].fill(0x0A);
    save("damaged_chunk", &d);
    let mut d = valid.clone();
    d[..64].fill(0xFF);
    save("first_header_damaged", &d);
    let mut d = wrapped.clone();
    d[data_at.1 + 8] |= 1;
    save("entry_mid_update", &d);
    save("truncated", &valid[..data_at.0 + 300]);
    save("empty", &[]);
}
