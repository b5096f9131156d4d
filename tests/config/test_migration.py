"""Tests for replax/config/migration.py: a stored config from an earlier replax gets the old
value of each setting added since."""

from replax.config import migration


def test_missing_settings_get_their_old_values_and_present_ones_stay():
    old = {"model": {"d_model": 32, "scan_layers": True}, "seed": 0}
    new = migration.migrate(old)
    assert new["model"] == {
        "d_model": 32,
        "scan_layers": True,  # as the run had it
        "remat_policy": "none",
        "attention": "einsum",
        "lora_rank": 0,  # no adapters
        "lora_alpha": 16.0,
        "lora_targets": "q,k,v,o,gate,up,down",
    }
    assert new["train"] == {
        "num_microbatches": 1,
        "logits_chunk_size": 0,
        "max_steps_per_generation": 1,
    }
    assert new["rollout"]["mesh_shape"] == [] and new["seed"] == 0
    assert new["rollout"]["placement"] == "colocated"  # what every earlier run did
    assert old == {"model": {"d_model": 32, "scan_layers": True}, "seed": 0}  # a copy


def test_every_added_setting_is_in_the_shipped_config():
    import os

    from replax.tools import experiments

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    c = experiments.load_config(os.path.join(root, "configs", "arith.py"), None)
    for key in migration.ADDED_KEYS:
        section, leaf = key.split(".")
        assert leaf in c[section], key


def test_a_renamed_setting_moves_to_its_new_name():
    old = {"loss": {"name": "ppo", "cov_clip_frac": 0.2}}
    new = migration.migrate(old)
    assert new["loss"]["cov_cut_frac"] == 0.2  # the run's value, not the added default 0
    assert "cov_clip_frac" not in new["loss"]
    assert new["loss"]["clip_cov_ratio"] == 0.0 and new["loss"]["kl_cov_frac"] == 0.0
    assert old == {"loss": {"name": "ppo", "cov_clip_frac": 0.2}}  # a copy
    both = migration.migrate({"loss": {"cov_clip_frac": 0.2, "cov_cut_frac": 0.1}})
    assert both["loss"] == {**both["loss"], "cov_cut_frac": 0.1}  # the new name wins


def test_an_old_config_with_the_old_name_parses_to_its_value():
    import os

    from replax.config import spec
    from replax.tools import experiments

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    values = experiments.load_config(os.path.join(root, "configs", "arith.py"), None).to_dict()
    values["loss"]["cov_clip_frac"] = values["loss"].pop("cov_cut_frac") / 2  # 0.1
    assert spec.parse(values).loss.cov_cut_frac == 0.1
