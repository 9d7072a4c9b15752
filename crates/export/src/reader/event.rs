//! One trace event straight from JSON into a [`TraceEvent`](super::TraceEvent), args included.

use super::*;

pub(super) struct EventSeed<'s> {
    pub(super) strings: &'s mut Interner,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = TraceEvent;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TraceEvent, D::Error> {
        d.deserialize_map(self)
    }
}

#[derive(Clone, Copy)]
pub(super) enum EventKey {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Id,
    Args,
    Other,
}

pub(super) struct EventKeySeed;

impl<'de> DeserializeSeed<'de> for EventKeySeed {
    type Value = EventKey;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<EventKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for EventKeySeed {
    type Value = EventKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<EventKey, E> {
        Ok(match v {
            "ph" => EventKey::Ph,
            "cat" => EventKey::Cat,
            "name" => EventKey::Name,
            "pid" => EventKey::Pid,
            "tid" => EventKey::Tid,
            "ts" => EventKey::Ts,
            "dur" => EventKey::Dur,
            "id" => EventKey::Id,
            "args" => EventKey::Args,
            _ => EventKey::Other,
        })
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = TraceEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TraceEvent, A::Error> {
        let mut ph = None;
        let mut cat = None;
        let mut name = None;
        let mut pid = None;
        let mut tid = None;
        let mut ts = None;
        let mut dur = None;
        let mut flow_id = None;
        let mut args = ArgFields::default();
        while let Some(key) = map.next_key_seed(EventKeySeed)? {
            match key {
                EventKey::Ph => ph = Some(map.next_value_seed(PhaseSeed)?),
                EventKey::Cat => cat = map.next_value_seed(InternSeed(&mut *self.strings))?,
                EventKey::Name => name = map.next_value_seed(InternSeed(&mut *self.strings))?,
                EventKey::Pid => pid = map.next_value_seed(RowIdSeed)?,
                EventKey::Tid => tid = map.next_value_seed(RowIdSeed)?,
                EventKey::Ts => ts = map.next_value_seed(NumSeed("ts"))?,
                EventKey::Dur => dur = map.next_value_seed(NumSeed("dur"))?,
                EventKey::Id => flow_id = map.next_value_seed(LenientInt { id: true })?,
                EventKey::Args => map.next_value_seed(ArgsSeed(&mut args))?,
                EventKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let ph = ph.ok_or_else(|| de::Error::custom("event has no `ph`"))?;
        let name = name.ok_or_else(|| de::Error::custom("event has no `name`"))?;
        let ts = match ts {
            Some(ts) => ts,
            None if ph == Phase::Metadata => RawNum::Int(0),
            None => return Err(de::Error::custom("event has no `ts`")),
        };
        Ok(TraceEvent {
            ph,
            cat,
            name,
            pid: pid.unwrap_or(RowId::Int(0)),
            tid: tid.unwrap_or(RowId::Int(0)),
            ts,
            dur,
            stream: args.stream,
            correlation: args.correlation,
            external_id: args.external_id,
            device: args.device,
            bytes: args.bytes,
            wait_on_stream: args.wait_on_stream,
            total_allocated: args.total_allocated,
            total_reserved: args.total_reserved,
            mem_bytes: args.mem_bytes,
            mem_device: args.mem_device,
            flow_id,
            op_args: finish(&mut args.kept, self.strings),
        })
    }
}

pub(super) struct PhaseSeed;

impl<'de> DeserializeSeed<'de> for PhaseSeed {
    type Value = Phase;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Phase, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for PhaseSeed {
    type Value = Phase;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a phase string (`ph`)")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Phase, E> {
        Ok(Phase::from_ph(v))
    }
}

/// Interns a `cat`/`name` string; numbers are interned as their text; `null` is `None`.
pub(super) struct InternSeed<'s>(pub(super) &'s mut Interner);

impl<'de> DeserializeSeed<'de> for InternSeed<'_> {
    type Value = Option<StrId>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<StrId>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for InternSeed<'_> {
    type Value = Option<StrId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<StrId>, E> {
        intern(self.0, v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<StrId>, E> {
        intern(self.0, itoa::Buffer::new().format(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<StrId>, E> {
        intern(self.0, itoa::Buffer::new().format(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<StrId>, E> {
        intern(self.0, &v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<StrId>, E> {
        Ok(None)
    }
}

/// Interns `s`; a string that cannot be kept fails the event (the parser words the error from
/// [`Interner::no_room`]).
#[inline]
fn intern<E: de::Error>(strings: &mut Interner, s: &str) -> Result<Option<StrId>, E> {
    match strings.intern(s) {
        Ok(id) => Ok(Some(id)),
        Err(_) => Err(E::custom("out of memory")),
    }
}

/// A pid/tid: integer, string, or `null` (`None`).
pub(super) struct RowIdSeed;

impl<'de> DeserializeSeed<'de> for RowIdSeed {
    type Value = Option<RowId>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<RowId>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for RowIdSeed {
    type Value = Option<RowId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or string pid/tid")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<RowId>, E> {
        Ok(Some(RowId::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<RowId>, E> {
        Ok(Some(match i64::try_from(v) {
            Ok(v) => RowId::Int(v),
            Err(_) => RowId::Str(itoa::Buffer::new().format(v).into()),
        }))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<RowId>, E> {
        Ok(Some(match f64_to_i64_exact(v) {
            Some(i) => RowId::Int(i),
            None => RowId::Str(v.to_string().into()),
        }))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<RowId>, E> {
        Ok(Some(RowId::Str(v.into())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<RowId>, E> {
        Ok(None)
    }
}

/// `ts`/`dur`: a number kept as written; a numeric string is accepted; `null` is `None`.
pub(super) struct NumSeed(pub(super) &'static str);

impl<'de> DeserializeSeed<'de> for NumSeed {
    type Value = Option<RawNum>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<RawNum>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for NumSeed {
    type Value = Option<RawNum>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a number of µs for `{}`", self.0)
    }
    #[inline]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<RawNum>, E> {
        Ok(Some(RawNum::Int(v)))
    }
    #[inline]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<RawNum>, E> {
        Ok(Some(match i64::try_from(v) {
            Ok(v) => RawNum::Int(v),
            Err(_) => RawNum::Float(v as f64),
        }))
    }
    #[inline]
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<RawNum>, E> {
        Ok(Some(RawNum::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<RawNum>, E> {
        let t = v.trim();
        if let Ok(i) = t.parse::<i64>() {
            return Ok(Some(RawNum::Int(i)));
        }
        match t.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Some(RawNum::Float(f))),
            _ => Err(E::custom(format_args!(
                "`{}` is not a number: {v:?}",
                self.0
            ))),
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<RawNum>, E> {
        Ok(None)
    }
}

pub(super) fn f64_to_i64_exact(v: f64) -> Option<i64> {
    // 2^63 is exactly representable; every f64 below it in magnitude converts without overflow.
    if v.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v)
    {
        Some(v as i64)
    } else {
        None
    }
}

pub(super) fn f64_to_i64_trunc(v: f64) -> Option<i64> {
    if v.is_finite() {
        f64_to_i64_exact(v.trunc())
    } else {
        None
    }
}

/// An integer from text the way pandas' `to_numeric` + `astype(int)` would take it: decimal
/// integers, or decimal floats truncated toward zero. With `hex`, `0x…` is accepted too (flow
/// ids, read as 64-bit two's complement).
pub(super) fn parse_int_text(s: &str, hex: bool) -> Option<i64> {
    let t = s.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Some(i);
    }
    if hex {
        if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            return u64::from_str_radix(h, 16).ok().map(|u| u as i64);
        }
    }
    t.parse::<f64>().ok().and_then(f64_to_i64_trunc)
}

/// A numeric field that HTA coerces to int: ints, floats (truncated), numeric strings;
/// anything else (`"0x0"`, `null`, arrays, objects, booleans) is `None`.
pub(super) struct LenientInt {
    /// For flow `id`s: u64 values wrap instead of being dropped, and hex strings count.
    pub(super) id: bool,
}

impl<'de> DeserializeSeed<'de> for LenientInt {
    type Value = Option<i64>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LenientInt {
    type Value = Option<i64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }
    #[inline]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<i64>, E> {
        Ok(Some(v))
    }
    #[inline]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<i64>, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Some(i),
            Err(_) if self.id => Some(v as i64),
            Err(_) => None,
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<i64>, E> {
        Ok(f64_to_i64_trunc(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<i64>, E> {
        Ok(parse_int_text(v, self.id))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<i64>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<i64>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<i64>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

#[derive(Default)]
pub(super) struct ArgFields {
    pub(super) stream: Option<i64>,
    pub(super) correlation: Option<i64>,
    pub(super) external_id: Option<i64>,
    pub(super) device: Option<i64>,
    pub(super) bytes: Option<i64>,
    pub(super) wait_on_stream: Option<i64>,
    pub(super) total_allocated: Option<i64>,
    pub(super) total_reserved: Option<i64>,
    pub(super) mem_bytes: Option<i64>,
    pub(super) mem_device: Option<i64>,
    /// The kept args' members, as canonical text (`kept.rs`); the serde path only.
    pub(super) kept: Vec<u8>,
}

#[derive(Clone, Copy)]
pub(super) enum ArgKey {
    Stream,
    Correlation,
    ExternalId,
    Device,
    Bytes,
    WaitOnStream,
    TotalAllocated,
    TotalReserved,
    MemBytes,
    MemDevice,
    /// A key of [`KEPT_ARGS`], by index.
    Kept(u8),
    Other,
}

pub(super) struct ArgKeySeed;

impl<'de> DeserializeSeed<'de> for ArgKeySeed {
    type Value = ArgKey;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<ArgKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for ArgKeySeed {
    type Value = ArgKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgKey, E> {
        Ok(match v {
            "stream" => ArgKey::Stream,
            "correlation" => ArgKey::Correlation,
            "External id" => ArgKey::ExternalId,
            "device" => ArgKey::Device,
            "bytes" => ArgKey::Bytes,
            "wait_on_stream" => ArgKey::WaitOnStream,
            "Total Allocated" => ArgKey::TotalAllocated,
            "Total Reserved" => ArgKey::TotalReserved,
            "Bytes" => ArgKey::MemBytes,
            "Device Id" => ArgKey::MemDevice,
            _ => kept_index(v.as_bytes()).map_or(ArgKey::Other, ArgKey::Kept),
        })
    }
}

/// `args`: an object whose known keys are pulled out; anything else is skipped (HTA ignores
/// an `args` that is not a dict).
pub(super) struct ArgsSeed<'a>(&'a mut ArgFields);

impl<'de> DeserializeSeed<'de> for ArgsSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an `args` object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let a = self.0;
        while let Some(key) = map.next_key_seed(ArgKeySeed)? {
            let slot = match key {
                ArgKey::Stream => &mut a.stream,
                ArgKey::Correlation => &mut a.correlation,
                ArgKey::ExternalId => &mut a.external_id,
                ArgKey::Device => &mut a.device,
                ArgKey::Bytes => &mut a.bytes,
                ArgKey::WaitOnStream => &mut a.wait_on_stream,
                ArgKey::TotalAllocated => &mut a.total_allocated,
                ArgKey::TotalReserved => &mut a.total_reserved,
                ArgKey::MemBytes => &mut a.mem_bytes,
                ArgKey::MemDevice => &mut a.mem_device,
                ArgKey::Kept(i) => {
                    open_member(&mut a.kept, i);
                    map.next_value_seed(CanonSeed(&mut a.kept))?;
                    continue;
                }
                ArgKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value_seed(LenientInt { id: false })?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}
