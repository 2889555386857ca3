//! Human sizes: `4K`, `1M`, `2G`, `512`, `1.5G`, `64KiB`.

/// Parses a size with an optional binary suffix (K, M, G, T; an optional `i`/`iB`/`B`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "'{text}': unknown size unit '{unit}' (use K, M, G or T)"
            ))
        }
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{text}': not a size (expected a number like 4096, 4K, 1.5G)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}': a size must be a non-negative number"));
    }
    let bytes = value * mult as f64;
    if bytes > u64::MAX as f64 {
        return Err(format!("'{text}': too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a memory budget (`--memory`): a size, not zero (a budget of nothing was blamed
/// on the dataset's first record).
pub fn parse_budget(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err(format!(
            "'{text}': a memory budget of 0 bytes holds nothing; give one such as 256M"
        )),
        n => Ok(n),
    }
}

/// Formats a byte count the way people read it: `4.0 KiB`, `1.5 GiB`.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1K").is_err());
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(4096.0), "4.0 KiB");
        assert_eq!(human_bytes(1.5 * (1u64 << 30) as f64), "1.5 GiB");
    }
}
