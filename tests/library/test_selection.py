"""select_variables: TF2's get_collection(TRAINABLE_VARIABLES, scope), with loud failure on no match."""

import keras
import pytest
import tensorflow as tf

from freezing import select_variables, variable_path


def _gan() -> keras.Model:
    z = keras.Input((4,))
    generator = keras.Sequential([keras.layers.Dense(8, name="g1"), keras.layers.Dense(3, name="g2")], name="generator")
    discriminator = keras.Sequential([keras.layers.Dense(5, name="d1"), keras.layers.Dense(1, name="d2")],
                                     name="discriminator")
    return keras.Model(z, discriminator(generator(z)), name="gan")


def test_scope_selects_exactly_the_subnetwork():
    gan = _gan()
    paths = [variable_path(v) for v in select_variables(gan, scope="generator/")]
    assert paths == ["generator/g1/kernel", "generator/g1/bias", "generator/g2/kernel", "generator/g2/bias"]
    assert len(select_variables(gan, scope="discriminator")) == 4


def test_scope_matches_whole_path_components():
    with pytest.raises(ValueError, match=r"scope='gen'.*available prefixes: discriminator/ \(4\), generator/ \(4\)"):
        select_variables(_gan(), scope="gen")


def test_pattern_is_a_regex_on_the_path():
    kernels = select_variables(_gan(), pattern=r"/kernel$")
    assert [variable_path(v) for v in kernels][-1] == "discriminator/d2/kernel"
    assert len(kernels) == 4
    assert len(select_variables(_gan(), scope="generator", pattern="g2/")) == 2


def test_trainable_false_hides_variables_unless_asked():
    gan = _gan()
    gan.get_layer("generator").trainable = False
    with pytest.raises(ValueError, match="matched none"):
        select_variables(gan, scope="generator/")
    assert len(select_variables(gan, scope="generator/", trainable_only=False)) == 4


def test_tf_module_and_plain_lists_work():
    class Net(tf.Module):
        def __init__(self):
            super().__init__(name="net")
            with self.name_scope:
                self.w = tf.Variable(1.0, name="w")
                self.frozen = tf.Variable(2.0, name="frozen", trainable=False)

    net = Net()
    assert [variable_path(v) for v in select_variables(net, scope="net")] == ["net/w"]
    assert select_variables([net.w, net.frozen], trainable_only=False, pattern="frozen") == [net.frozen]


def test_a_model_without_variables_says_so():
    with pytest.raises(ValueError, match="no trainable variables"):
        select_variables(keras.Sequential([keras.layers.Dense(2)]))


def test_wrong_source_type_is_a_type_error():
    with pytest.raises(TypeError, match="Keras layer or model"):
        select_variables(42)
