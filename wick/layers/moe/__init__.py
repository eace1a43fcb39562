"""Mixture-of-experts: routing, the expert weights and the fused-experts computation."""
