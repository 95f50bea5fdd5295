"""The search space: drawing a trial's values (`when` applied) and refusing, before any work, a space no trial could use
(a knob that changes the prepared data, one no trial reads, a bound or combination the params refuse)."""

from __future__ import annotations

import itertools
import logging
import math
import typing

from pydantic import BaseModel, ValidationError

from tqc.config import ConfigError, Params, SearchDimension, flatten, problems, unflatten

log = logging.getLogger("tqc.tune")  # one logger for tuning, whichever module says it


# Knobs that change the prepared data: the tuner prepares data once, so it cannot search them.
# Every key the augment stage reads is one of them (implicit, rate and the in-batch options act in training).
DATA_PREPARATION = ("seed", "data.", "validate.", "augment.rebalance", "augment.target_count", "augment.max_factor",
                    "augment.explicit", "augment.eda_alpha", "augment.seq2seq.")


def sample_overrides(trial, space: dict[str, SearchDimension], base: dict) -> dict:
    """The trial's values, as flat 'section.key' overrides. A dimension whose `when` does not
    hold (on the values sampled so far, else the base params) is not sampled at all."""
    values: dict = {}
    for name, dimension in _conditions_first(space):
        if _applies(dimension, values, base):
            values[name] = _suggest(trial, name, dimension, base.get(name))
    return values


def _listed(wanted) -> list:
    """A `when` value as the values it accepts: a list's, or the one given."""
    return wanted if isinstance(wanted, list) else [wanted]


def _applies(dimension: SearchDimension, values: dict, base: dict) -> bool:
    """Whether a trial that has drawn `values` so far (the base params' value elsewhere) draws `dimension`: every param
    its `when` names is the value given there, or one of the values listed."""
    return all(values.get(path, base.get(path)) in _listed(wanted) for path, wanted in dimension.when.items())


def _each_condition(when: dict) -> list[dict]:
    """Every set of values a `when` accepts, one value from each param's list: {} for none."""
    return [dict(zip(when, values)) for values in itertools.product(*map(_listed, when.values()))]


def _conditions_first(space: dict[str, SearchDimension]) -> list[tuple[str, SearchDimension]]:
    """Each dimension before every one whose `when` names it, so `when` reads this trial's value of them wherever
    they are listed (else a margin listed before its loss would read the base loss, and the last link of a chain,
    C when B when A, B's value decided on the base A)."""
    named_by = {name: [other for other, dimension in space.items() if name in dimension.when] for name in space}

    def height(name: str, seen: frozenset = frozenset()) -> int:  # the longest chain of `when`s that lead to it
        if name in seen:  # a cycle: no order serves it; it ends the chain
            return 0
        return max((1 + height(other, seen | {name}) for other in named_by[name]), default=0)

    return sorted(space.items(), key=lambda item: -height(item[0]))  # stable: the order as listed otherwise


def _suggest(trial, name: str, dimension: SearchDimension, base_value=None):
    """An integer knob (its base value an int, e.g. mine.k) gets integers, any other range floats,
    whatever the YAML bounds look like (low: 0 for a margin, high: 12.0 for K)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    drawn_from = distribution(name, dimension, base_value)  # the kind decided once, where the study check reads it
    if isinstance(drawn_from, CategoricalDistribution):
        return trial.suggest_categorical(name, drawn_from.choices)
    suggest = trial.suggest_int if isinstance(drawn_from, IntDistribution) else trial.suggest_float
    return suggest(name, drawn_from.low, drawn_from.high, log=drawn_from.log)


def distribution(name: str, dimension: SearchDimension, base_value=None):
    """The Optuna distribution `_suggest` draws `name` from: a study refuses another kind, other choices or another
    `log` under a name it has sampled (`study.check_study_space`)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if dimension.choices is not None:
        return CategoricalDistribution(dimension.choices)
    if samples_integers(name, base_value):
        return IntDistribution(math.ceil(dimension.low), math.floor(dimension.high), log=dimension.log)
    return FloatDistribution(float(dimension.low), float(dimension.high), log=dimension.log)


def samples_integers(name: str, base_value) -> bool:
    """An int param (mine.k, not a bool) is searched over integers, also where its base value is null
    (stage_one.max_steps: `int | None`); every other range over floats."""
    if base_value is not None:
        return isinstance(base_value, int) and not isinstance(base_value, bool)
    kinds = set(typing.get_args(_annotation(name))) - {type(None)}
    return kinds == {int}


def _annotation(name: str):
    """The declared type of a 'section.key' parameter (aliases such as `validate` included)."""
    model, annotation = Params, None
    for part in name.split("."):
        fields = {field.alias or key: field for key, field in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None:
            break
    return annotation


def flat_base(params: Params) -> dict:
    """params as flat 'section.key' values, the study's own settings left out: what trials start from."""
    return flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))


def default_values(space: dict[str, SearchDimension], base: dict) -> dict:
    """The base params' own value of every dimension that applies to them: trial 0."""
    values: dict = {}
    for name, dimension in _conditions_first(space):
        if _applies(dimension, values, base):
            values[name] = base[name]
    return values


def check_space(params: Params) -> None:
    """Refuse, before any data is prepared or trial trained, a dimension no trial can use: one that changes the
    prepared data, one the objective never reads, or a bound, choice or `when` value the params would refuse."""
    for name in params.tune.space:
        if name.startswith(DATA_PREPARATION) or name == "seed":
            raise ConfigError(f"tune.space: {name!r} changes the prepared data; tune it with separate studies")
        if name.startswith(NOT_TUNED_ON):
            raise ConfigError(f"tune.space: {name!r} does not change what a trial is judged by (stage two's validation "
                              "macro-F1, before any class-prior shift; no NC baseline): its best value would be chance")
    if not params.tune.space:
        raise ConfigError("tune.space is empty: nothing to tune")
    epochs = [name for name in ("stage_one.epochs", "stage_two.epochs") if name in params.tune.space]
    if epochs and params.tune.pruner != "none":
        raise ConfigError(f"tune.space: {', '.join(epochs)} searched under tune.pruner {params.tune.pruner}: the pruner "
                          "compares trials step by step, and a trial's step n is stage two's epoch n − stage_one.epochs, "
                          "so searched epochs set one trial's stage-two epoch beside another's stage-one epoch (and "
                          "past hyperband's last step); search them with tune.pruner: none")
    base = flat_base(params)
    space = params.tune.space
    for name, dimension in space.items():
        for path, wanted in dimension.when.items():
            _check_condition(params, name, path, wanted, base)
        values = _values_to_check(name, dimension, base)
        # with the values its `when` needs, as a trial has them: a listed value no trial has never acts
        for needed in _each_condition(_had_by_trials(dimension.when, space, base)):
            for value in values:
                _accepted(params, {**needed, name: value}, name, value, f"tune.space.{name}")
        _acts_in_some_trial(name, dimension, space, base)
        _switched_on_in_some_trial(name, space, base)
        _read_in_some_trial(name, space, base)
    _combinations_accepted(params, space, base)


def _check_condition(params: Params, name: str, path: str, wanted, base: dict) -> None:
    """`name`'s `when` on `path`: each value it gives is one the params accept, and some trial has one of them
    (drawn by tune.space.`path`, or `path`'s base value where it is not searched), else `name` is never tuned. A
    list may also name values no trial has (the losses that read a knob, beside a space that draws fewer of them):
    they never act, and narrowing `path`'s choices needs no edit of the list."""
    where = f"tune.space.{name}.when"
    listed = _listed(wanted)
    if not listed:
        raise ConfigError(f"{where}: {path} lists no value, so no trial would tune {name}")
    for value in listed:
        _accepted(params, {path: value}, path, value, where)
    space = params.tune.space
    if any(_some_trial_can_have(space, path, value, base) for value in listed):
        return
    unmet = f"so no trial would tune {name}"
    reasons = [_why_no_trial_has(space, path, value, base) for value in listed]
    raise ConfigError(f"{where}: {reasons[0]}, {unmet}" if len(reasons) == 1 else
                      f"{where}: no trial has {path} in {listed!r}, {unmet} ({'; '.join(reasons)})")


def _why_no_trial_has(space: dict[str, SearchDimension], path: str, value, base: dict) -> str:
    """Why no trial has `path` = `value`: tune.space.`path` never draws it, or nothing draws `path` and the base
    value decides, for every trial."""
    if path not in space:
        return f"{path} is {base.get(path)!r} in every trial (it is not searched), never {value!r}"
    dimension = space[path]
    drawn = dimension.choices if dimension.choices is not None else f"[{dimension.low}, {dimension.high}]"
    return f"{path} = {value!r} is never drawn (tune.space.{path} draws from {drawn})"


def _some_trial_can_have(space: dict[str, SearchDimension], path: str, value, base: dict) -> bool:
    """Whether some trial has `path` = `value`: tune.space.`path` draws it, or `path` is not searched and its base
    value is `value`."""
    return _drawn(space[path], path, value, base) if path in space else base.get(path) == value


def _had_by_trials(when: dict, space: dict[str, SearchDimension], base: dict) -> dict:
    """`when` with each list cut to the values some trial has (`_check_condition` has made sure one is left)."""
    return {path: [value for value in _listed(wanted) if _some_trial_can_have(space, path, value, base)]
            for path, wanted in when.items()}


# A loss's own knob: it changes nothing under the other losses (`losses.make_loss`)
KNOB_OF_LOSS = {"margin": "hinge", "smoothing": "sdml"}


# A knob every loss reads but one: hinge compares raw scores with a margin, and has no temperature
UNREAD_BY_LOSS = {"temperature": "hinge"}


def _losses_drawn_with(dimension: SearchDimension, space: dict[str, SearchDimension], base: dict, loss: str) -> set:
    """The values of `loss` in the trials that draw `dimension`: those tune.space draws (else the base one), less
    any its `when` leaves out."""
    possible = set(space[loss].choices or []) if loss in space else {base.get(loss)}
    return possible & set(_listed(dimension.when[loss])) if loss in dimension.when else possible


def _unread_in_some_trials(name: str, dimension: SearchDimension, space: dict[str, SearchDimension], base: dict,
                           loss: str, unread_by: str) -> None:
    """A knob searched beside a loss that never reads it: said, since those trials' draws of it are chance (Optuna
    learns from a value that did nothing), and a best trial of that loss carries one into best_params.yaml."""
    losses = _losses_drawn_with(dimension, space, base, loss)
    if losses == {unread_by}:
        raise ConfigError(f"tune.space.{name}: {loss} is {unread_by} in every trial, which never reads it (hinge has no "
                          "temperature): its best value would be chance")
    if unread_by in losses:
        readers = ", ".join(sorted(map(str, losses - {unread_by})))
        log.warning("tune: tune.space.%s is not read where %s is %s (hinge has no temperature): those trials draw it for "
                    "nothing, and a best one of them leaves it at chance; draw it only with the others: "
                    "when: {%s: [%s]}", name, loss, unread_by, loss, readers)


def _acts_in_some_trial(name: str, dimension: SearchDimension, space: dict[str, SearchDimension], base: dict) -> None:
    """A loss's knob searched where no trial trains that loss is refused: its best value would be chance, and
    best_params.yaml would carry it. Searched beside other losses (no `when` on the loss, or one that lists them too),
    it is said."""
    stage, _, knob = name.rpartition(".")
    if f"{stage}.loss" not in base:  # a section with no choice of loss: warmup.margin is its triplet loss's own
        return
    if knob in UNREAD_BY_LOSS:
        _unread_in_some_trials(name, dimension, space, base, f"{stage}.loss", UNREAD_BY_LOSS[knob])
    if knob not in KNOB_OF_LOSS:
        return
    loss, needed = f"{stage}.loss", KNOB_OF_LOSS[knob]
    losses = _losses_drawn_with(dimension, space, base, loss)
    if needed not in losses:
        raise ConfigError(f"tune.space.{name}: acts only with {loss}: {needed}, and {loss} is "
                          f"{' or '.join(sorted(map(str, losses)))} in every trial; search {loss} too, with "
                          f"when: {{{loss}: {needed}}} on {name}")
    if len(losses) > 1:
        log.warning("tune: tune.space.%s acts only with %s: %s; drawn where %s is %s too, the other losses' trials draw "
                    "it for nothing: give it when: {%s: %s}", name, loss, needed, loss,
                    " or ".join(sorted(map(str, losses - {needed}))), loss, needed)


def _switched_on_in_some_trial(name: str, space: dict[str, SearchDimension], base: dict) -> None:
    """A knob of a feature that is off in every trial (the warm-up, prototype mixup, cross-encoding: its section's
    `enabled`) is refused: no trial reads it, so its best value would be chance, and best_params.yaml would carry it."""
    section = name.rpartition(".")[0]
    while section:
        switch = f"{section}.enabled"
        if switch in base and name != switch:
            if not _some_trial_can_have(space, switch, True, base):
                raise ConfigError(f"tune.space.{name}: {switch} is false in every trial, so no trial reads it; set "
                                  f"{switch}: true, or search {switch} too, with when: {{{switch}: true}} on {name}")
            return
        section = section.rpartition(".")[0]


# A knob read only beside some other setting: (path, value) pairs, one of which a trial must have. The stage heads' own
# rate: attention pooling and the MLP scorer are the heads (`BiEncoder.head_parameters`); without one it trains nothing.
_HEADS = (("model.pooling", "attention"), ("model.similarity", "mlp"))
READ_ONLY_WITH = {"stage_one.head_learning_rate": _HEADS, "stage_two.head_learning_rate": _HEADS}
# Read only where augment.implicit lists an augmentation (the encoder's EmbeddingAugmentation); a list is never a
# search choice, so its base value decides
READ_ONLY_WITH_IMPLICIT = ("augment.rate", "augment.implicit_at")


def _read_in_some_trial(name: str, space: dict[str, SearchDimension], base: dict) -> None:
    """A knob no trial reads, beside the settings every trial has, is refused, as a feature's switched off: its best
    value would be chance, and best_params.yaml would carry it."""
    if name in READ_ONLY_WITH_IMPLICIT and not base.get("augment.implicit"):
        raise ConfigError(f"tune.space.{name}: augment.implicit is empty, so no trial augments and none reads it; "
                          "list an implicit augmentation in augment.implicit (dropout, cutoff)")
    needs = READ_ONLY_WITH.get(name, ())
    if needs and not any(_some_trial_can_have(space, path, value, base) for path, value in needs):
        wanted = " or ".join(f"{path}: {value}" for path, value in needs)
        raise ConfigError(f"tune.space.{name}: it trains the heads, and no trial has one ({wanted}); search or set "
                          "one of them, or leave it out")


def _values_to_check(name: str, dimension: SearchDimension, base: dict) -> list:
    """The values a trial can sample at the edges of a dimension: every choice, or both bounds as sampled."""
    if dimension.choices is not None:
        if not dimension.choices:
            raise ConfigError(f"tune.space.{name}: choices is empty")
        return list(dimension.choices)
    if samples_integers(name, base.get(name)):
        low, high = math.ceil(dimension.low), math.floor(dimension.high)
        if low > high:  # Optuna would refuse it at the first trial, naming no dimension
            raise ConfigError(f"tune.space.{name}: {name} takes integers, and none lies in [{dimension.low}, {dimension.high}]")
        return [low, high]
    return [float(dimension.low), float(dimension.high)]


def _drawn(dimension: SearchDimension, path: str, value, base: dict) -> bool:
    """Whether `dimension` (tune.space.`path`) can draw `value`: a choice, or an integer in an integer range (a float
    range's draws never equal one value)."""
    if dimension.choices is not None:
        return value in dimension.choices
    integer = isinstance(value, int) and not isinstance(value, bool)
    return integer and samples_integers(path, base.get(path)) and dimension.low <= value <= dimension.high


# Past this many combinations of edge values, check_space checks every pair of dimensions instead
MOST_COMBINATIONS = 20_000


def _combinations_accepted(params: Params, space: dict[str, SearchDimension], base: dict) -> None:
    """Every combination a trial may draw of the dimensions' edge values, `when` applied as a trial applies it,
    is params the config accepts. Each value alone may be fine while two together are not (loss hinge with a
    searched logit_adjustment above 0): a trial that drew them would stop its worker, not just fail."""
    ordered = _conditions_first(space)
    combinations = _edge_combinations(ordered, base)
    if combinations is None:  # too many: every pair of dimensions, each pair with its own conditions
        combinations = [combo for i, first in enumerate(ordered) for second in ordered[i + 1:]
                        for combo in _edge_combinations([first, second], base)]
    for combination in combinations:
        if _refusal(params, combination) is not None:
            smallest = _smallest_refused(params, combination)
            drawn = ", ".join(f"{name} = {value!r}" for name, value in smallest.items())
            raise ConfigError(f"tune.space: a trial may draw {drawn} together, which the params refuse:\n"
                              f"{_refusal(params, smallest)}\n(narrow the space, or add a `when` so they are never drawn "
                              "together)")


def _edge_combinations(ordered: list[tuple[str, SearchDimension]], base: dict) -> list[dict] | None:
    """The combinations of edge values a trial can draw (a dimension whose `when` fails keeps the base value);
    None when there are more than MOST_COMBINATIONS."""
    combinations: list[dict] = [{}]
    for name, dimension in ordered:
        values = _values_to_check(name, dimension, base)
        grown = []
        for combination in combinations:
            if _applies(dimension, combination, base):
                grown += [{**combination, name: value} for value in values]
            else:
                grown.append(combination)
        if len(grown) > MOST_COMBINATIONS:
            return None
        combinations = grown
    return combinations


def _refusal(params: Params, overrides: dict) -> str | None:
    """The params' problems, a line each, with the flat `overrides` (a trial's drawn values) set; None: accepted."""
    try:
        params.validated_with(unflatten(overrides))
    except ValidationError as exc:
        return problems(exc)
    return None


def _smallest_refused(params: Params, combination: dict) -> dict:
    """A refused combination with every value left out whose absence keeps it refused: the ones that clash."""
    smallest = dict(combination)
    for name in combination:
        fewer = {key: value for key, value in smallest.items() if key != name}
        if fewer and _refusal(params, fewer) is not None:
            smallest = fewer
    return smallest


def _accepted(params: Params, overrides: dict, name: str, value, where: str) -> None:
    """`name` is a parameter (Params' own validator said so); whether `value` is one it takes (in `overrides`)."""
    refused = _refusal(params, overrides)
    if refused is not None:
        raise ConfigError(f"{where}: {name} = {value!r} is not a value the params accept:\n{refused}")


def within_wrong_classes(space: dict[str, SearchDimension], n_classes: int, largest_group: int = 1
                         ) -> dict[str, SearchDimension]:
    """The space with mine.k's range cut to the wrong classes there are: mining clips K to C − 1 anyway (C minus
    the largest group of classes sharing one standard question, `mining.largest_group`, where twins are), so every K
    above it would train the same model (on TREC-6, 6 of the default 2..12 would be one trial repeated)."""
    dimension, wrong = space.get("mine.k"), n_classes - largest_group
    if dimension is None or dimension.choices is not None or dimension.high <= wrong:
        return space
    low = min(dimension.low, wrong)
    twins = f", {largest_group} of them sharing one standard question," if largest_group > 1 else ""
    log.info("tune: mine.k searched over %s..%s, not %s..%s: these data have %d classes%s so at most %d wrong ones "
             "to mine", low, wrong, dimension.low, dimension.high, n_classes, twins, wrong)
    return {**space, "mine.k": dimension.model_copy(update={"low": low, "high": wrong})}


# Params a study's trials do not depend on: where things are, how they are logged, what runs around them
# (a trial's objective is stage two's validation macro-F1 before any class-prior shift: no trial runs the prior stage,
# nor trains the NC baseline), and mine.batch_size, how many questions mining encodes at a time, which mines the same
# negatives at any size.
NOT_TUNED_ON = ("data.data_dir", "tracking.", "promote.", "retrain.", "ablate.", "distributed.", "evaluate.", "prior.",
                "baseline_nc.", "mine.batch_size")


def same_value(current, new) -> bool:
    """Equal, and of the same kind: 5 against 5.0, or 1 against true, would change what the param reads as."""
    return current == new and all(isinstance(current, kind) == isinstance(new, kind) for kind in (float, bool))

