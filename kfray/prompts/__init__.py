"""Prompt building and the co-evolved meta-prompt population."""
