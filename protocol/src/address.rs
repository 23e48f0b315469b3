//! `HOST:PORT`: where a client logs in, and where a host of a deployment is reached.

/// Checks one `HOST:PORT`: an IP address (IPv6 in brackets) or a host name, a colon, a port
/// from 1 to 65535. The error says what is wrong, to be put after the address by the caller.
pub fn check_host_port(address: &str) -> Result<(), &'static str> {
    if address.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("no port");
    };
    if !port.parse::<u16>().is_ok_and(|p| p > 0) {
        return Err("the port is not a number from 1 to 65535");
    }
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if host_ok {
        Ok(())
    } else {
        Err("not a host name")
    }
}

/// Checks an address a host gives a client to go to ([`crate::wire::Message::Elsewhere`]): a
/// `HOST:PORT` ([`check_host_port`]) that names a host, not a wildcard (`0.0.0.0`, `[::]`: a
/// host listening on every address advertises that when told nothing).
pub fn check_destination(address: &str) -> Result<(), &'static str> {
    check_host_port(address)?;
    match address.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => Err("a wildcard address, which names no host"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_destination, check_host_port};

    #[test]
    fn a_client_is_sent_only_to_an_address_that_names_a_host() {
        for named in [
            "10.0.0.2:4433",
            "b.example:4433",
            // Hosts of one machine.
            "127.0.0.1:4433",
            "[::1]:4433",
        ] {
            assert_eq!(check_destination(named), Ok(()), "{named}");
        }
        // Nothing, not HOST:PORT, or a host's default listen address, which names no host.
        for unnamed in ["", " ", "b.example", "0.0.0.0:4433", "[::]:4433"] {
            assert!(check_destination(unnamed).is_err(), "{unnamed:?}");
        }
    }

    #[test]
    fn host_names_and_addresses_with_a_port_pass_and_anything_else_says_why() {
        for good in [
            "monad.example.com:4433",
            "10.0.0.2:1",
            "[::1]:65535",
            "host_1:80",
            "localhost:9",
        ] {
            assert_eq!(check_host_port(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("monad.example.com", "no port"),
            ("host:0", "the port"),
            ("host:65536", "the port"),
            ("host:", "the port"),
            (":4433", "not a host name"),
            ("http://a b/:80", "not a host name"),
            ("a b:80", "not a host name"),
            ("::1:4433", "not a host name"),
            ("http://host:4433/", "the port"),
        ] {
            let said = check_host_port(bad).unwrap_err();
            assert!(said.starts_with(why), "{bad}: {said}");
        }
    }
}
