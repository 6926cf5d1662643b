"""Study 01: why frozen entries still move under Adam (notebook ``01_adam_drift``).

``adam_drift`` runs the seed example in TF1 and TF2, the drift sweep over optimizers and policies, and the
closed-form prediction of Adam's drift; ``plots`` draws its figures. The notebook imports both modules:
``from study.drift import adam_drift, plots``.
"""
