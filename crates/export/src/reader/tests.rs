//! Unit tests of the reader's pieces.

use super::rank::{find_bytes, find_rank};
use super::*;
use proptest::prelude::*;

#[test]
fn float_us_rounds_to_nearest_ns() {
    assert_eq!(
        RawNum::Float(4458676983543.183).us_to_ns(),
        4_458_676_983_543_183
    );
    assert_eq!(RawNum::Float(1.0005).us_to_ns(), 1_000); // the f64 is just below 1.0005
    assert_eq!(RawNum::Float(1.0015).us_to_ns(), 1_002); // the f64 is just above 1.0015
    assert_eq!(RawNum::Float(-2.5).us_to_ns(), -2_500);
    assert_eq!(RawNum::Float(0.0004).us_to_ns(), 0);
    assert_eq!(
        RawNum::Int(1_682_725_898_236_567).us_to_ns(),
        1_682_725_898_236_567_000
    );
    assert_eq!(RawNum::Float(f64::NAN).us_to_ns(), 0);
    assert_eq!(RawNum::Float(1e300).us_to_ns(), i64::MAX);
    assert_eq!(RawNum::Int(i64::MIN).us_to_ns(), i64::MIN);
}

#[test]
fn rank_regex() {
    assert_eq!(find_rank(br#"{"rank": 3,"#), Some(Some(3)));
    assert_eq!(find_rank(br#"{"rank":3,"#), None);
    assert_eq!(find_rank(br#"{"rank": -3,"#), None);
    assert_eq!(
        find_rank(br#"{"rank":3, "x": {"rank":  17}"#),
        Some(Some(17))
    );
    assert_eq!(find_rank("\"rank\":\u{a0}\t 42".as_bytes()), Some(Some(42)));
    assert_eq!(find_rank(b"\"rank\":\x1f5"), Some(Some(5)));
    assert_eq!(find_rank(b"\"rank\": 99999999999999999999"), Some(None));
    assert_eq!(find_rank(b"\"rank\": \n"), None);
}

#[test]
fn find_bytes_works() {
    assert_eq!(find_bytes(b"aab", b"ab"), Some(1));
    assert_eq!(find_bytes(b"a", b"ab"), None);
    assert_eq!(find_bytes(b"", b"ab"), None);
    assert_eq!(find_bytes(b"xxab", b"ab"), Some(2));
}

// ---------------------------------------------------------------------------------------------
// The fast event path against serde_json

/// What serde_json (the path every event took before the fast path) makes of `bytes`: the
/// event's `Debug` text (which tells `-0.0` from `0.0`) and the strings interned.
fn serde_event(bytes: &[u8]) -> Result<(String, Vec<Box<str>>), String> {
    let mut strings = Interner::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let event = EventSeed {
        strings: &mut strings,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(|e| e.to_string())?;
    Ok((format!("{event:?}"), strings.strings))
}

/// Checks the fast path on the bytes of one event: when it answers, it answers what serde_json
/// does, and it never asks for more bytes after a valid event. Every strict prefix must ask for
/// more or fall back. Returns whether the fast path took it.
fn check_fast(bytes: &[u8]) -> bool {
    let mut strings = Interner::default();
    // The bytes the event takes: all of them, unless an edit closed the object early (a `}` put
    // into a value): then the event ends there, as it does for serde_json reading the array, and
    // what follows is the array's to reject.
    let mut end = bytes.len();
    let took = match parse_event(bytes, &mut strings, &mut Vec::new()) {
        Fast::Done(event, len) => {
            let text = String::from_utf8_lossy(bytes);
            assert!(
                len == bytes.len() || (len < bytes.len() && bytes[len - 1] == b'}'),
                "length {len} of {text}"
            );
            end = len;
            let (want, want_strings) = serde_event(&bytes[..len])
                .unwrap_or_else(|e| panic!("fast path took {text}, serde_json rejects it: {e}"));
            assert_eq!(format!("{event:?}"), want, "event {text}");
            assert_eq!(strings.strings, want_strings, "interned strings of {text}");
            true
        }
        // Asking for more is right only where the event is cut off; at the end of the input
        // the caller then lets serde_json report it.
        Fast::More => {
            assert!(
                serde_event(bytes).is_err(),
                "fast path asked for more after a whole event: {}",
                String::from_utf8_lossy(bytes)
            );
            false
        }
        Fast::Fallback => false,
    };
    for cut in 0..end {
        let mut strings = Interner::default();
        if let Fast::Done(..) = parse_event(&bytes[..cut], &mut strings, &mut Vec::new()) {
            panic!(
                "fast path took a prefix ({cut} bytes) of {}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
    took
}

#[test]
fn an_event_closed_early_by_a_stray_brace_ends_there() {
    // Found by `fast_path_agrees_with_serde_after_edits` in CI: an edit put `}` into the `ts`
    // number, so the object ends inside it; both paths read the same event up to there.
    let text = "{\n\t \"ph\": \"X\"\n\t ,\n\t \"name\": \"m\"\n\t ,\n\t \"ts\": 18661820353886.477885976292}6747800\n\t ,\n\t \"dur\": 1\n\t }";
    assert!(check_fast(text.as_bytes()));
}

#[test]
fn fast_path_takes_kineto_events_and_matches_serde() {
    let events = [
        // Kineto's own shapes: float µs, args with known and unknown keys, flows, memory.
        r#"{"ph": "X", "cat": "kernel", "name": "void at::native::f<float>(int)", "pid": 0, "tid": 7, "ts": 4458676416431.397, "dur": 2.5, "args": {"External id": 31, "device": 0, "stream": 7, "correlation": 1234, "registers per thread": 32, "grid": [1, 2, 3], "est. achieved occupancy %": 0}}"#,
        r#"{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1712195495406752,"dur":12,"args":{"Input Dims":[[2,3],[3,4]],"Input type":["float","float"],"Sequence number":-1,"Fwd thread id":0}}"#,
        r#"{"ph": "s", "id": 18446744073709551615, "pid": 1, "tid": 1, "ts": 5, "cat": "ac2g", "name": "ac2g"}"#,
        r#"{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 7.25, "args": {"Total Reserved": 2097152, "Total Allocated": 512, "Bytes": 512.9, "Addr": 140000, "Device Id": -1, "Device Type": 0}}"#,
        r#"{"name": "process_name", "ph": "M", "pid": "Spans", "tid": "", "args": {"name": "Spans"}}"#,
        r#"{"ph":"X","name":"n","ts":-0,"dur":-0.0,"pid":-9223372036854775808,"tid":9223372036854775808,"args":{"stream":"0x0","device":"3","bytes":1e3,"wait_on_stream":null,"correlation":true}}"#,
        r#"{"ph":"C","name":7,"cat":null,"ts":1E-7,"dur":123456789012345678,"id":"0x1F","args":[1,{"a":"},{"}]}"#,
        // Strings with `},{`, escapes in skipped values, nested args.
        r#"{"ph":"X","name":"a},{b","ts":1,"args":{"Call stack":"x.py(1): f\n\"q\" \u00e9 \/","nested":{"x":[{"y":"]}"}],"z":{}},"stream":3}}"#,
        "{ \"ph\" : \"X\" ,\n\t\"name\" : \"é ü\" , \"ts\" : 0.1 , \"x\" : [ ] , \"y\" : { } }",
        // Duplicates: the last one wins, as in serde's visitor.
        r#"{"ph":"X","name":"a","name":"b","ts":1,"ts":2.0,"args":{"stream":1},"args":{"device":2}}"#,
    ];
    for e in events {
        assert!(check_fast(e.as_bytes()), "the fast path fell back on {e}");
    }
}

#[test]
fn op_args_are_one_canonical_string_on_both_paths() {
    // Kineto's layout (spaces after commas, members on their own lines) becomes compact text with
    // the kept members in file order; `Seq`, addresses and the rest are left out.
    let text = "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::addmm\", \"ts\": 1, \"dur\": 2,\n  \"args\": {\n    \"External id\": 13, \"Concrete Inputs\": [\"\", \"\", \"\", \"1\", \"1\"],\n    \"Input type\": [\"float\", \"float\", \"float\", \"Scalar\", \"Scalar\"],\n    \"Input Strides\": [[1], [128, 1], [1, 128], [], []], \"Input Dims\": [[128], [5, 128], [128, 128], [], []], \"Seq\": 7, \"Ev Idx\": 46}}";
    assert!(check_fast(text.as_bytes()));
    let mut strings = Interner::default();
    let Fast::Done(event, _) = parse_event(text.as_bytes(), &mut strings, &mut Vec::new()) else {
        panic!("fast path did not take a torch op")
    };
    let id = event.op_args.expect("kept args");
    assert_eq!(
        &*strings.strings[id.0 as usize],
        r#"{"Concrete Inputs":["","","","1","1"],"Input type":["float","float","float","Scalar","Scalar"],"Input Strides":[[1],[128,1],[1,128],[],[]],"Input Dims":[[128],[5,128],[128,128],[],[]]}"#
    );
    // The same inputs written differently are the same string; an event without them has none.
    let again = text.replace(", ", ",").replace("\n    ", "");
    let Fast::Done(other, _) = parse_event(again.as_bytes(), &mut strings, &mut Vec::new()) else {
        panic!("fast path did not take the compact form")
    };
    assert_eq!(other.op_args, Some(id));
    let Fast::Done(plain, _) = parse_event(
        br#"{"ph":"X","name":"k","ts":1,"args":{"stream":7}}"#,
        &mut strings,
        &mut Vec::new(),
    ) else {
        panic!("fast path did not take a kernel")
    };
    assert_eq!(plain.op_args, None);
    // The buffer is reused: what an event that fell back left in it is not the next one's.
    let mut kept = Vec::new();
    let falls_back =
        br#"{"ph":"X","name":"c","ts":1,"args":{"Input Dims":[[1]],"dtype":"Fl\u006fat"}}"#;
    assert!(matches!(
        parse_event(falls_back, &mut strings, &mut kept),
        Fast::Fallback
    ));
    assert!(!kept.is_empty());
    let next = br#"{"ph":"X","name":"c","ts":1,"args":{"Input Dims":[[2]]}}"#;
    let Fast::Done(ev, _) = parse_event(next, &mut strings, &mut kept) else {
        panic!("fast path did not take {next:?}")
    };
    assert_eq!(
        &*strings.strings[ev.op_args.unwrap().0 as usize],
        r#"{"Input Dims":[[2]]}"#
    );
    // Where the fast path cannot write the text serde_json would (escapes, nesting), it falls
    // back; serde_json's canonical text is then the one kept.
    for e in [
        r#"{"ph":"X","name":"c","ts":1,"args":{"dtype":"Fl\u006fat","Group size":2}}"#,
        r#"{"ph":"X","name":"c","ts":1,"args":{"Concrete Inputs":["a\"b"]}}"#,
    ] {
        assert!(!check_fast(e.as_bytes()), "{e}");
    }
    let (debug, strings) = serde_event(
        br#"{"ph":"X","name":"c","ts":1,"args":{"dtype":"Fl\u006fat","Group size":2.50,"In split size":{"a":[1e2, -0, null, true]}}}"#,
    )
    .unwrap();
    assert!(debug.contains("op_args: Some"), "{debug}");
    assert!(
        strings.iter().any(|s| &**s
            == r#"{"dtype":"Float","Group size":2.5,"In split size":{"a":[100.0,-0.0,null,true]}}"#),
        "{strings:?}"
    );
    // Nested values, floats and negative numbers match on both paths.
    assert!(check_fast(
        br#"{"ph":"X","name":"c","ts":1,"args":{"Process Group Ranks":[0, 1],"Input Dims":[[-1, 2.5e3], {"k": [1.0]}], "In msg nelems": 18446744073709551615}}"#
    ));
}

#[test]
fn fast_path_falls_back_where_serde_decides() {
    let cases = [
        // Escapes in kept strings, control characters, malformed numbers and syntax, types.
        r#"{"ph":"X","name":"a\"b","ts":1}"#,
        r#"{"ph":"X","name":"a","ts":1,"x":"tab	here"}"#,
        r#"{"ph":"X","name":"a","ts":01}"#,
        r#"{"ph":"X","name":"a","ts":1.}"#,
        r#"{"ph":"X","name":"a","ts":1e400}"#,
        r#"{"ph":"X","name":"a","ts":123456789012345678901}"#,
        r#"{"ph":"X","name":"a","ts":1,}"#,
        r#"{"ph":"X","name":"a","ts":1 "dur":2}"#,
        r#"{"ph":"X","name":"a","ts":[1]}"#,
        r#"{"ph":"X","name":"a","ts":true}"#,
        r#"{"ph":1,"name":"a","ts":1}"#,
        r#"{"ph":"X","name":"a","ts":1,"x":"\q"}"#,
        r#"{"ph":"X","name":"a","ts":1,"x":"\u12G4"}"#,
        r#"{"ph":"X","name":"a","ts":1,"x":nul}"#,
        r#"{"ph":"X","name":"a","ts":1,"args":{"stream":[1]}}"#,
        r#"{"ph":"X","name":"a"}"#,
        r#"{"ph":"X","ts":1}"#,
        r#"{"name":"a","ts":1}"#,
        r#"{}"#,
        r#"[1]"#,
    ];
    for e in cases {
        assert!(!check_fast(e.as_bytes()), "the fast path took {e}");
    }
    // Not UTF-8: in a kept string and in a key serde_json rejects it; in a skipped string not.
    assert!(!check_fast(b"{\"ph\":\"X\",\"name\":\"\xff\",\"ts\":1}"));
    assert!(!check_fast(
        b"{\"ph\":\"X\",\"name\":\"a\",\"\xff\":1,\"ts\":1}"
    ));
    assert!(check_fast(
        b"{\"ph\":\"X\",\"name\":\"a\",\"x\":\"\xff\",\"ts\":1}"
    ));
    // Deep nesting in a skipped value.
    let deep = format!(
        r#"{{"ph":"X","name":"a","ts":1,"x":{}{}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert!(!check_fast(deep.as_bytes()));
}

fn json_string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("abc".to_string()),
        Just("},{".to_string()),
        Just("]".to_string()),
        Just(r#"\""#.to_string()),
        Just(r"\\".to_string()),
        Just(r"\n".to_string()),
        Just(r"\u00e9".to_string()),
        Just(r"\ud83d\ude00".to_string()),
        Just("é€".to_string()),
        Just("aten::mm".to_string()),
        Just(" ".to_string()),
    ];
    proptest::collection::vec(piece, 0..4).prop_map(|p| format!("\"{}\"", p.concat()))
}

fn json_number() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,21})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
        "-?[1-9][0-9]{12,16}\\.[0-9]{1,3}",
        "-?[0-9]{1,6}",
        Just("9223372036854775807".to_string()),
        Just("9223372036854775808".to_string()),
        Just("-9223372036854775809".to_string()),
        Just("18446744073709551616".to_string()),
    ]
}

fn json_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => json_number(),
        3 => json_string(),
        1 => Just("null".to_string()),
        1 => Just("true".to_string()),
        1 => Just("false".to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = String> {
    json_scalar().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((json_string(), inner), 0..4).prop_map(|v| {
                let members: Vec<String> =
                    v.into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!("{{{}}}", members.join(", "))
            }),
        ]
    })
}

fn arg_member() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("stream"),
        Just("correlation"),
        Just("External id"),
        Just("device"),
        Just("bytes"),
        Just("wait_on_stream"),
        Just("Total Allocated"),
        Just("Total Reserved"),
        Just("Bytes"),
        Just("Device Id"),
        Just("grid"),
        Just("Call stack"),
        Just("Input Dims"),
        Just("Concrete Inputs"),
        Just("dtype"),
    ];
    (key, prop_oneof![4 => json_scalar(), 1 => json_value()])
        .prop_map(|(k, v)| format!("\"{k}\": {v}"))
}

fn event_member() -> impl Strategy<Value = String> {
    let ph = prop_oneof![
        Just("\"X\"".to_string()),
        Just("\"i\"".to_string()),
        Just("\"M\"".to_string()),
        Just("\"f\"".to_string()),
        json_scalar(),
    ];
    let args = prop_oneof![
        4 => proptest::collection::vec(arg_member(), 0..5)
            .prop_map(|m| format!("{{{}}}", m.join(", "))),
        1 => json_value(),
    ];
    prop_oneof![
        ph.prop_map(|v| format!("\"ph\": {v}")),
        json_scalar().prop_map(|v| format!("\"cat\": {v}")),
        json_scalar().prop_map(|v| format!("\"name\": {v}")),
        json_scalar().prop_map(|v| format!("\"pid\": {v}")),
        json_scalar().prop_map(|v| format!("\"tid\": {v}")),
        json_scalar().prop_map(|v| format!("\"ts\": {v}")),
        json_scalar().prop_map(|v| format!("\"dur\": {v}")),
        json_scalar().prop_map(|v| format!("\"id\": {v}")),
        args.prop_map(|v| format!("\"args\": {v}")),
        (json_string(), json_value()).prop_map(|(k, v)| format!("{k}: {v}")),
    ]
}

/// An event with the three required members (in a random place) and up to eight others.
fn event_text() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec(event_member(), 0..8),
        "[a-z]{1,3}",
        json_number(),
        any::<proptest::sample::Index>(),
        prop_oneof![Just(""), Just(" "), Just("\n\t ")],
    )
        .prop_map(|(mut members, name, ts, at, ws)| {
            let required = [
                "\"ph\": \"X\"".to_string(),
                format!("\"name\": \"{name}\""),
                format!("\"ts\": {ts}"),
            ];
            for (k, r) in required.into_iter().enumerate() {
                let i = at.index(members.len() + 1);
                members.insert((i + k) % (members.len() + 1), r);
            }
            format!("{{{ws}{}{ws}}}", members.join(&format!("{ws},{ws}")))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fast_path_agrees_with_serde(text in event_text()) {
        check_fast(text.as_bytes());
    }

    #[test]
    fn fast_path_agrees_with_serde_after_edits(
        text in event_text(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = text.into_bytes();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        check_fast(&bytes);
    }
}

#[test]
fn fast_path_numbers_match_serde() {
    // Exactness at the edges of the one-rounding path and beyond it.
    for ts in [
        "9007199254740992.0",
        "9007199254740993.0",
        "0.1",
        "0.30000000000000004",
        "4458676416431.397",
        "1712195495406752.8",
        "1e22",
        "1e23",
        "123456789012345678.9",
        "1234567890123456789.0",
        "0.000000000000000000000001234",
        "2.2250738585072014e-308",
        "5e-324",
        "1.7976931348623157e308",
        "-1.5e-5",
        "0e99",
    ] {
        let e = format!(r#"{{"ph":"X","name":"a","ts":{ts}}}"#);
        assert!(check_fast(e.as_bytes()), "fell back on {ts}");
    }
}

/// The piped window gives at least as many new bytes as asked for (what keeps the fast path's
/// restarts of a long event logarithmic), keeps the unparsed rest in place across buffers
/// whether it fits the head or not, and counts offsets from the stream's first byte.
#[test]
fn piped_fill_takes_what_is_asked_and_keeps_offsets() {
    let data: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let (piped, inflater) = input::pipeline();
    std::thread::scope(|scope| {
        scope.spawn(|| inflater.run(&data[..]));
        let mut input = Input::piped(io::empty(), piped, DEFAULT_MAX_VALUE_BYTES);
        assert!(input.fill_some(1).unwrap());
        let first = input.end - input.pos;
        assert!(first >= input::BUF_SIZE, "{first}");
        assert_eq!(input.offset(), 0);
        // Nothing consumed: the rest is longer than the head and must all stay.
        assert!(input.fill_some(first).unwrap());
        assert!(input.end - input.pos >= 2 * first);
        assert!(input.fill_some(700_000).unwrap());
        let held = input.end - input.pos;
        assert!(held >= 2 * first + 700_000, "{held}");
        assert_eq!(&input.buf[input.pos..input.end], &data[..held]);
        // Consume all but 100 bytes: the rest fits the head and moves into the next buffer.
        input.pos = input.end - 100;
        assert!(input.fill().unwrap());
        assert_eq!(input.offset(), held as u64 - 100);
        let at = input.offset() as usize;
        assert_eq!(
            &input.buf[input.pos..input.end],
            &data[at..at + input.end - input.pos]
        );
        while input.fill_some(1 << 20).unwrap() {}
        assert_eq!(input.offset_end(), data.len() as u64);
        assert_eq!(&input.buf[input.pos..input.end], &data[at..]);
    });
}

/// A long string is scanned once however many fills it takes: [`Scan`] resumes where it stopped.
/// It used to rescan the string from its start on every fill, which through the 320 KiB
/// inflate pipe made a 256 MiB string take 52 s.
#[test]
fn a_long_string_is_scanned_once_across_fills() {
    let n = 4 << 20;
    let mut data = vec![b'a'; n];
    data[0] = b'"';
    data[n - 1] = b'"';
    let mut scan = Scan::new(b'"');
    // Bytes looked at: each call starts where the scan says it stopped.
    let mut examined = 0;
    let mut end = 1;
    let len = loop {
        end = (end + 32 * 1024).min(n);
        examined += end - scan.len;
        if let Some(len) = scan.advance(&data[..end]) {
            break len;
        }
    };
    assert_eq!(len, n);
    assert!(
        examined <= n,
        "{examined} bytes examined for a {n}-byte string"
    );
}

/// The value limit, exactly: a value of `max_value` bytes is read, one byte more is
/// [`Fail::TooLarge`] at the value's first byte, whether it fits in the window or not.
#[test]
fn value_len_refuses_a_value_one_byte_over_the_limit() {
    for limit in [100, 300 * 1024] {
        for (over, value) in [
            (false, format!("\"{}\"", "a".repeat(limit - 2))),
            (true, format!("\"{}\"", "a".repeat(limit - 1))),
            (false, format!("[{}]", "1,".repeat((limit - 3) / 2) + "1")),
            (false, "7".repeat(limit)),
            (true, "7".repeat(limit + 1)),
        ] {
            let doc = format!("  {value} ");
            let mut input = Input::new(doc.as_bytes(), limit);
            assert_eq!(input.skip_ws().unwrap(), Some(doc.as_bytes()[2]));
            match input.value_len() {
                Ok(Some(len)) => {
                    assert!(!over, "limit {limit}: {}-byte value read", value.len());
                    assert_eq!(len, value.len());
                }
                Err(Fail::TooLarge { at, limit: l }) => {
                    assert!(over, "limit {limit}: {}-byte value refused", value.len());
                    assert_eq!((at, l), (2, limit));
                }
                other => panic!("limit {limit}: {other:?}"),
            }
            assert!(
                input.buf.capacity() <= limit.max(BUF_SIZE) + input::PIPE_HEAD + BUF_SIZE,
                "window {} for a limit of {limit}",
                input.buf.capacity()
            );
        }
    }
}

/// The streaming rank search finds what HTA's line-by-line regex finds, however the input is
/// cut into reads.
fn check_rank_search(text: &[u8], gzip: bool, cuts: &[usize]) {
    let lines: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
    let want = lines.iter().find_map(|line| {
        if gzip {
            find_rank(line)
        } else {
            line.split(|&b| b == b'\r').find_map(find_rank)
        }
    });
    let mut search = super::rank::RankSearch::new(gzip);
    let mut got = None;
    let mut from = 0;
    for &cut in cuts.iter().chain([&text.len()]) {
        let cut = cut.clamp(from, text.len());
        if let Some(r) = search.feed(&text[from..cut]) {
            got = Some(r);
            break;
        }
        from = cut;
    }
    let got = got.or_else(|| search.finish().map(Some));
    assert_eq!(
        got.unwrap_or(None),
        want.unwrap_or(None),
        "{:?} (gzip {gzip}, cuts {cuts:?})",
        String::from_utf8_lossy(text)
    );
}

#[test]
fn rank_search_matches_the_line_regex() {
    for text in [
        &b"{\"rank\": 3,"[..],
        b"{\"rank\":3,",
        b"\"rank\":\"rank\": 4",
        b"\"rank\"rank\": 4",
        b"\"rank\"\"rank\": 4",
        "\"rank\":\u{a0}\t 42".as_bytes(),
        "\"rank\":\u{3000}7 ".as_bytes(),
        b"\"rank\":\xe3\x80 7",
        b"\"rank\":\xe3\x80\"rank\": 9",
        b"\"rank\":\x1f5",
        b"\"rank\": 99999999999999999999",
        b"\"rank\": \n5 \"rank\": 6",
        b"\"rank\":\r 4",
        b"\"rank\": 12",
        b"x\"rank\": 007}",
    ] {
        for gzip in [false, true] {
            for cut in 0..=text.len() {
                check_rank_search(text, gzip, &[cut]);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn rank_search_agrees_with_the_line_regex(
        parts in prop::collection::vec(prop::sample::select(vec![
            "\"rank\":", "\"rank\"", "\"", " ", "\t", "\n", "\r", "\u{a0}", "\u{2028}", "1", "42",
            "x", ":", "-", "\u{e9}", "\u{3000}", "99999999999999999999",
        ]), 0..12),
        cuts in prop::collection::vec(0usize..64, 0..4),
        gzip in any::<bool>(),
    ) {
        let text = parts.concat();
        let mut cuts = cuts;
        cuts.sort_unstable();
        check_rank_search(text.as_bytes(), gzip, &cuts);
        // Invalid UTF-8 too: the text cut at each byte, then a stray byte.
        let mut bytes = text.into_bytes();
        bytes.insert(bytes.len() / 2, 0xe2);
        check_rank_search(&bytes, gzip, &cuts);
    }
}
