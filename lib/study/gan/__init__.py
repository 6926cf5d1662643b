"""Study 03: freezing one network while training the other, in alternating GAN steps (notebook ``03_gan_alternating``).

``alternating`` trains the GAN with every freezing method (``var_list``, ``trainable``, ``stop_gradient``, random
gates, ``MaskedOptimizer``) and audits the frozen network; ``tables`` summarises the runs; ``plots`` draws the
figures. The notebook imports all three: ``from study.gan import alternating, plots, tables``.
"""
