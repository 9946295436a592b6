"""Search-space files: flag validation with suggestions, pruning, and the NEURON_CC_FLAGS they compose."""

import pytest

from nki_ops.tune.flags import SpaceError, compose_neuron_cc_flags
from nki_ops.tune.space import load_space, parse_space, trial_settings


def test_misspelled_flag_value_is_refused_with_the_suggestion(write_space):
    message = r"invalid value 'matmul' for neuronx-cc flag 'auto-cast'; did you mean 'matmult'\?"
    with pytest.raises(SpaceError, match=message):
        load_space(write_space('[neuron_cc_flags]\nauto-cast = ["none", "matmul"]\n'))


def test_misspelled_flag_name_is_refused_with_the_suggestion():
    with pytest.raises(SpaceError, match=r"unknown neuronx-cc flag 'model_type'.*did you mean 'model-type'\?"):
        parse_space({"neuron_cc_flags": {"model_type": ["transformer"]}})


def test_optlevel_refuses_a_boolean_and_switches_refuse_numbers():
    with pytest.raises(SpaceError, match="invalid value True for neuronx-cc flag 'optlevel'"):
        parse_space({"neuron_cc_flags": {"optlevel": [2, True]}})
    with pytest.raises(SpaceError, match="'enable-saturate-infinity'"):
        parse_space({"neuron_cc_flags": {"enable-saturate-infinity": [0, 1]}})


def test_bad_files_say_what_was_expected(write_space):
    with pytest.raises(SpaceError, match="unknown table"):
        parse_space({"flags": {}})
    with pytest.raises(SpaceError, match="lists no values"):
        parse_space({"params": {"batch_size": []}})
    with pytest.raises(SpaceError, match="not valid TOML"):
        load_space(write_space("[params\n"))
    with pytest.raises(SpaceError, match="does not exist"):
        load_space("missing.toml")


def test_auto_cast_type_without_auto_cast_collapses_into_one_point():
    space = parse_space({"neuron_cc_flags": {"auto-cast": ["none", "matmult", "all"],
                                             "auto-cast-type": ["bf16", "fp16"]}})
    flags = [trial_settings(p)[0]["NEURON_CC_FLAGS"] for p in space.points]
    assert flags == ["--auto-cast=none", "--auto-cast=matmult --auto-cast-type=bf16",
                     "--auto-cast=matmult --auto-cast-type=fp16", "--auto-cast=all --auto-cast-type=bf16",
                     "--auto-cast=all --auto-cast-type=fp16"]
    assert len(space.pruned) == 1 and space.pruned[0][1].startswith("no effect: runs the same as point 0")


def test_invalid_combinations_are_pruned_and_listed():
    space = parse_space({"env": {"XLA_USE_BF16": [0, 1], "XLA_DOWNCAST_BF16": [0, 1]},
                         "neuron_cc_flags": {"target": ["trn2", "trn1"], "logical-nc-config": [2]}})
    assert len(space.points) == 3  # 2 x 2 x 2 minus both-bf16 minus -lnc on trn1
    reasons = {reason for _, reason in space.pruned}
    assert "invalid: XLA_USE_BF16 together with XLA_DOWNCAST_BF16 (choose one bf16 mode)" in reasons
    assert "invalid: --logical-nc-config needs --target=trn2 (got --target=trn1)" in reasons


def test_an_invalid_default_is_refused():
    with pytest.raises(SpaceError, match="default configuration .* is invalid: XLA_USE_BF16 together"):
        parse_space({"env": {"XLA_USE_BF16": [1], "XLA_DOWNCAST_BF16": [1, 0]}})


def test_settings_reach_env_and_params():
    space = parse_space({"neuron_cc_flags": {"model-type": "transformer", "optlevel": 3,
                                             "enable-saturate-infinity": [True, False]},
                         "env": {"XLA_USE_BF16": [True]}, "params": {"batch_size": [8]}})
    env, params = trial_settings(space.baseline)
    assert env == {"XLA_USE_BF16": "1",
                   "NEURON_CC_FLAGS": "--enable-saturate-infinity --model-type=transformer --optlevel=3"}
    assert params == {"batch_size": 8}
    assert compose_neuron_cc_flags({"enable-saturate-infinity": False, "target": "inf2"}) == "--target=inf2"
