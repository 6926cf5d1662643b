"""Worked examples that use the study's tools on models and data that are not the study's."""
