//! The `resource.Quantity` forms in Tessera's slices and claims: memory in binary units, compute as a plain count of
//! milli-GPUs. The API server canonicalises what it stores (`30720Mi` comes back `30Gi`, `1000` may come back `1k`),
//! so reading accepts every suffix Kubernetes writes, not only the ones written here.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity that is not a number with a Kubernetes suffix, or does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a quantity Tessera can read (a number with an optional suffix: Ki Mi Gi Ti Pi Ei, m k M G T P E)"
)]
pub struct BadQuantity(pub String);

/// The quantity's value in its base unit (bytes for memory, count for compute), rounded up: a consumed quantity
/// read a little large never lets two tenants be counted into room that is not there.
pub fn parse(q: &str) -> Result<f64, BadQuantity> {
    let bad = || BadQuantity(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse::<i32>().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    let v = n * mult;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(bad())
    }
}

/// A memory quantity in MiB, rounded up.
pub fn mib(q: &Quantity) -> Result<u64, BadQuantity> {
    Ok((parse(&q.0)? / (1024.0 * 1024.0)).ceil() as u64)
}

/// A compute quantity (a count of milli-GPUs), rounded up.
pub fn milli(q: &Quantity) -> Result<u32, BadQuantity> {
    let v = parse(&q.0)?.ceil();
    if v > f64::from(u32::MAX) {
        return Err(BadQuantity(q.0.clone()));
    }
    Ok(v as u32)
}

/// `n` MiB as a quantity.
pub fn of_mib(n: u64) -> Quantity {
    Quantity(format!("{n}Mi"))
}

/// `n` milli-GPUs as a quantity.
pub fn of_milli(n: u32) -> Quantity {
    Quantity(n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_api_server_writes_back() {
        assert_eq!(mib(&Quantity("30Gi".into())), Ok(30720));
        assert_eq!(mib(&Quantity("30720Mi".into())), Ok(30720));
        assert_eq!(mib(&Quantity("1500Ki".into())), Ok(2), "rounded up, never down");
        assert_eq!(milli(&Quantity("1k".into())), Ok(1000));
        assert_eq!(milli(&Quantity("250".into())), Ok(250));
        assert_eq!(milli(&Quantity("2500m".into())), Ok(3));
        assert_eq!(milli(&Quantity("1e3".into())), Ok(1000));
        assert!(
            mib(&Quantity("ten".into()))
                .expect_err("not a number")
                .to_string()
                .contains("\"ten\"")
        );
        assert!(mib(&Quantity("5Xi".into())).is_err());
        assert!(mib(&Quantity("-5Mi".into())).is_err());
    }
}
