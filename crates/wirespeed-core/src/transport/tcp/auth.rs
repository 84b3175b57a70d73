//! The job secret's proofs at the handshake.
//!
//! Why: the hello's key is built from the job token, which ranks read from torch's store, and
//! anyone who reaches MASTER_PORT can read the store too. A secret that the launchers carry out of
//! band (WIRESPEED_JOB_SECRET in every rank's environment) is what the store does not hold. Each
//! side proves it knows the secret by a MAC over the other side's fresh nonce, so a proof seen on
//! the wire cannot be replayed: the dialer's hello carries its nonce and the listener answers with
//! its own nonce and a MAC over the dialer's; the dialer checks that (a stale rank of another job,
//! or an impostor, listening where a rank should be is found out), then answers with a MAC over
//! the listener's nonce, which the listener checks before the stream joins a connection.
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;

/// A job secret, as the core keeps it: SHA-256 of the text, so any length of text fits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    /// The secret of a text; None for an empty one (which protects nothing).
    pub fn from_text(text: &str) -> Option<Secret> {
        if text.is_empty() {
            return None;
        }
        let mut h = Sha256::new();
        h.update(b"wirespeed job secret\0");
        h.update(text.as_bytes());
        Some(Secret(h.finalize().into()))
    }

    fn mac(&self, side: &[u8], hello: &[u8], nonce: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(side);
        m.update(hello);
        m.update(nonce);
        m
    }

    /// The listener's proof: over the dialer's whole hello (its nonce included).
    pub fn listener_proof(&self, hello: &[u8], listener_nonce: &[u8]) -> [u8; MAC_LEN] {
        self.mac(b"listener", hello, listener_nonce).finalize().into_bytes().into()
    }

    /// The dialer's proof: over the listener's fresh nonce.
    pub fn dialer_proof(&self, hello: &[u8], listener_nonce: &[u8]) -> [u8; MAC_LEN] {
        self.mac(b"dialer", hello, listener_nonce).finalize().into_bytes().into()
    }

    /// Compared in constant time: a timing difference must not tell a guesser how close it is.
    pub fn check_listener(&self, hello: &[u8], listener_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(b"listener", hello, listener_nonce).verify_slice(proof).is_ok()
    }

    pub fn check_dialer(&self, hello: &[u8], listener_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(b"dialer", hello, listener_nonce).verify_slice(proof).is_ok()
    }
}

impl std::fmt::Debug for Secret {
    /// Never printed: a log line must not carry it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

pub fn nonce() -> crate::error::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    crate::sys::random_bytes(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_the_secret_the_side_the_hello_and_the_nonce() {
        let s = Secret::from_text("job-1").unwrap();
        let other = Secret::from_text("job-2").unwrap();
        let (hello, n) = (b"hello".as_slice(), [7u8; 32]);
        let p = s.listener_proof(hello, &n);
        assert!(s.check_listener(hello, &n, &p));
        assert!(!other.check_listener(hello, &n, &p));
        assert!(!s.check_dialer(hello, &n, &p), "a listener's proof is no dialer's");
        assert!(!s.check_listener(b"hellp", &n, &p));
        assert!(!s.check_listener(hello, &[8u8; 32], &p));
        assert!(Secret::from_text("").is_none());
        assert_ne!(nonce().unwrap(), nonce().unwrap());
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
