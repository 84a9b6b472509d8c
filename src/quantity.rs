//! Byte counts as Kubernetes writes them (`resource.Quantity`'s integer forms): `10Gi`,
//! `500M`, `1073741824`. Used by node-server's `--capacity` and inline volumes' `size`, and by
//! the upstream logging flags that take a buffer size.

/// A size that is not a byte count we can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("invalid size {0:?}: expected bytes such as 10Gi, 500M or 1073741824")]
    Malformed(String),
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

/// A byte count as Kubernetes writes it; the flag values that take one wrap it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(u64);

impl Quantity {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(text: &str) -> Result<Self, QuantityError> {
        parse_quantity(text).map(Quantity)
    }
}

/// Parses a byte count, with an optional Kubernetes-style suffix: `Ki Mi Gi Ti Pi Ei`
/// (powers of 1024) or `k M G T P E` (powers of 1000).
pub fn parse_quantity(text: &str) -> Result<u64, QuantityError> {
    let bad = || QuantityError::Malformed(text.to_owned());
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(multiplier)
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| QuantityError::TooLarge(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_with_binary_and_decimal_suffixes() {
        assert_eq!(parse_quantity("1073741824"), Ok(1 << 30));
        assert_eq!(
            parse_quantity("9Ei"),
            Err(QuantityError::TooLarge("9Ei".into()))
        );
        assert_eq!(parse_quantity("10Gi"), Ok(10 << 30));
        assert_eq!(parse_quantity("500M"), Ok(500_000_000));
        assert_eq!(parse_quantity("1k"), Ok(1000));
        assert_eq!(parse_quantity("0"), Ok(0));
        assert_eq!("2Ki".parse::<Quantity>().map(Quantity::bytes), Ok(2048));
    }

    #[test]
    fn malformed_or_overflowing_quantities_are_refused_by_name() {
        for bad in ["", "Gi", "10 Gi", "10gb", "-1", "1.5Gi", "9Ei"] {
            let err = parse_quantity(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
    }
}
