//! A snapshot as a table or as one JSON object.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{HoldRole, Holder, LeaseLeft, Snapshot};
use serde_json::{json, Value};

/// The snapshot as one JSON object.
pub fn json(snapshot: &Snapshot) -> Value {
    json!({
        "name": snapshot.name.as_str(),
        "kind": snapshot.kind.as_str(),
        "backend": snapshot.backend,
        "held": snapshot.is_held(),
        "holders": snapshot.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "waiters": {
            "count": snapshot.waiters.count,
            "owners": snapshot.waiters.owners,
        },
        "leader": snapshot.leader.as_ref().map(|l| json!({ "id": l.id, "term": l.term })),
        "permits": snapshot.permits,
        "never_freed": never_freed(snapshot).is_some(),
    })
}

fn holder_json(holder: &Holder) -> Value {
    let (lease, left_ms, session) = match holder.lease {
        LeaseLeft::Ttl(left) => ("ttl", Some(millis(left)), None),
        LeaseLeft::Session { session_id } => ("session", None, Some(session_id)),
        _ => ("no_expiry", None, None),
    };
    json!({
        "role": role(holder.role),
        "owner": holder.owner,
        "foreign": holder.foreign,
        "fencing_token": holder.fencing_token,
        "acquired_at": holder.acquired_at.map(rfc3339),
        "acquired_at_unix_ms": holder.acquired_at.and_then(unix_ms),
        "lease": lease,
        "lease_left_ms": left_ms,
        "session_id": session,
        "release_requested": holder.release_requested,
    })
}

/// The snapshot as a small table.
pub fn table(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} on {}: {}",
        snapshot.kind,
        snapshot.name,
        snapshot.backend,
        if snapshot.is_held() { "held" } else { "free" }
    );
    if let Some(permits) = snapshot.permits {
        let _ = writeln!(out, "permits: {permits}");
    }
    if let Some(leader) = &snapshot.leader {
        let _ = writeln!(out, "leader: {} (term {})", leader.id, leader.term);
    }
    if snapshot.is_held() {
        let rows: Vec<[String; 6]> = snapshot
            .holders
            .iter()
            .map(|h| {
                [
                    role(h.role).to_owned(),
                    owner(h),
                    h.fencing_token
                        .map_or_else(|| "-".into(), |t| t.to_string()),
                    h.acquired_at.map_or_else(|| "-".into(), rfc3339),
                    lease_left(h.lease),
                    if h.release_requested { "yes" } else { "-" }.to_owned(),
                ]
            })
            .collect();
        let header = [
            "ROLE",
            "OWNER",
            "TOKEN",
            "ACQUIRED AT",
            "LEASE LEFT",
            "ASKED TO RELEASE",
        ];
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut line = |cells: [&str; 6]| {
            let mut l = String::new();
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(cell);
                } else {
                    let _ = write!(l, "{cell:<w$}  ");
                }
            }
            let _ = writeln!(out, "{}", l.trim_end());
        };
        line(header);
        for row in &rows {
            line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]);
        }
    }
    if let Some(note) = never_freed(snapshot) {
        let _ = writeln!(out, "note: {note}");
    }
    let waiters = &snapshot.waiters;
    if waiters.owners.is_empty() {
        let _ = writeln!(out, "waiters: {}", waiters.count);
    } else {
        let _ = writeln!(
            out,
            "waiters: {} ({})",
            waiters.count,
            waiters.owners.join(", ")
        );
    }
    out
}

/// What to say when a holder is not distlock's and its key never expires:
/// nobody will release it (a plain string set by hand or by another
/// program), so `exec` would wait for it forever.
pub fn never_freed(snapshot: &Snapshot) -> Option<String> {
    let stuck = snapshot
        .holders
        .iter()
        .find(|h| h.owner.is_none() && h.foreign.is_some() && h.lease == LeaseLeft::NoExpiry)?;
    let what = stuck.foreign.as_deref().unwrap_or("?");
    Some(format!(
        "{} is held by a value that is not distlock's ({what}) and has no expiry: it is never freed unless someone deletes it, so a waiter waits forever (use exec -w SECS to bound the wait, or unlock --force)",
        snapshot.name
    ))
}

/// Who holds, in a few words (for the spinner).
pub fn holders_brief(snapshot: &Snapshot) -> String {
    holders_of(&snapshot.holders)
}

/// `holders` in a few words: `free`, `held by X`, `held by X and 2 more`.
pub fn holders_of(holders: &[Holder]) -> String {
    match holders {
        [] => "free".into(),
        [one] => format!("held by {}", owner(one)),
        [one, rest @ ..] => format!("held by {} and {} more", owner(one), rest.len()),
    }
}

fn owner(holder: &Holder) -> String {
    match (&holder.owner, &holder.foreign) {
        (Some(owner), _) => owner.clone(),
        (None, Some(foreign)) => format!("foreign ({foreign})"),
        (None, None) => "?".into(),
    }
}

fn role(role: HoldRole) -> &'static str {
    match role {
        HoldRole::Exclusive => "exclusive",
        HoldRole::Read => "read",
        HoldRole::Write => "write",
        HoldRole::Permit => "permit",
        HoldRole::Leader => "leader",
        _ => "holder",
    }
}

fn lease_left(lease: LeaseLeft) -> String {
    match lease {
        LeaseLeft::Ttl(left) => format!("{:.1}s", left.as_secs_f64()),
        LeaseLeft::Session { session_id } => format!("session 0x{session_id:x}"),
        _ => "no expiry".into(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(millis)
}

/// `2026-11-30T16:22:13.123Z` (UTC); times before 1970 print as the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.789Z");
    }
}
