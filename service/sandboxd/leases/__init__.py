"""Leases that say what happens at the end: each session's `on_expiry` and
`renew_on_activity` terms, the reaper's expiry action, and why an ended session ended."""

from sandboxd.leases.expiry import ExpiryPolicy
from sandboxd.leases.terms import (
    DELETE,
    EXPIRY_ACTIONS,
    SNAPSHOT_THEN_DELETE,
    SUSPEND,
    LeaseTerms,
    LeaseTermsStore,
)

__all__ = [
    "DELETE",
    "EXPIRY_ACTIONS",
    "SNAPSHOT_THEN_DELETE",
    "SUSPEND",
    "ExpiryPolicy",
    "LeaseTerms",
    "LeaseTermsStore",
]
