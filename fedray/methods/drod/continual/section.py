"""The ``continual`` config section, registered by the sub-model methods' package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fedray.core import registry
from fedray.core.config import check_unread, num_classes
from fedray.core.spec import ConfigError, spec


@dataclass
class ContinualConfig:
    """Federated class-incremental learning (DROD §3): the classes are cut, in a fixed order,
    into ``tasks`` disjoint tasks that reach every client at the same round boundaries;
    one shared head, no task id. Each task's samples are split among the clients with
    Dirichlet(``data.alpha``), redrawn per task: ``data.partition`` must say dirichlet, and
    the data knobs a stream does not read (feature skew, label drift) stay unset."""

    tasks: int = spec(0, ge=0, help="number of tasks (0: no task stream)")
    rounds_per_task: int = spec(1, ge=1, help="communication rounds per task")
    class_order: list[int] | None = spec(None, help="class order cut into tasks "
                                                    "(default 0..C-1, the paper's fixed order)")
    method: Literal["none", "er", "derpp", "bic", "ewc"] = spec(
        "er", help="continual-learning objective: none (fine-tune), er (experience replay), "
                   "derpp (DER++), bic (bias correction), ewc (online EWC)")
    buffer_total: int = spec(200, ge=0, help="fleet-wide replay exemplars, split uniformly "
                                             "over the clients")
    replay_batch: int | None = spec(None, ge=1, help="exemplars appended per local batch "
                                                     "(default local.batch_size)")
    derpp_alpha: float = spec(0.1, ge=0, help="DER++ weight of the logit-matching term")
    derpp_beta: float = spec(0.5, ge=0, help="DER++ weight of the replayed-label term")
    ewc_lambda: float = spec(10.0, ge=0, help="EWC penalty strength λ")
    ewc_gamma: float = spec(1.0, ge=0, le=1, help="online-EWC decay of the old Fisher")
    ewc_samples: int = spec(256, ge=1, help="samples per Fisher estimate")
    bic_steps: int = spec(300, ge=1, help="gradient steps of BiC's two-parameter stage")
    bic_lr: float = spec(0.1, gt=0, help="learning rate of BiC's two-parameter stage")
    bic_temperature: float = spec(2.0, gt=0, help="BiC distillation temperature")


    def validate(self, cfg: Any) -> None:
        """The task stream must cut the classes evenly, reach a score at every task
        boundary, and run under a method of the sub-model family."""
        if not self.tasks:
            return
        registry.require(registry.method_of(cfg), "continual",
                         "continual.tasks", self.tasks)
        classes = num_classes(cfg)
        if classes % self.tasks:
            raise ConfigError("continual.tasks", self.tasks,
                              f"a divisor of the dataset's {classes} classes")
        if self.class_order is not None and sorted(self.class_order) != list(range(classes)):
            raise ConfigError("continual.class_order", self.class_order,
                              f"a permutation of 0..{classes - 1}")
        if cfg.eval.every and self.rounds_per_task % cfg.eval.every:
            raise ConfigError("eval.every", cfg.eval.every,
                              f"a divisor of continual.rounds_per_task = "
                              f"{self.rounds_per_task} (the accuracy matrix needs a score at "
                              f"every task boundary)")
        if cfg.rounds > self.tasks * self.rounds_per_task:
            raise ConfigError("rounds", cfg.rounds, f"at most continual.tasks x "
                                                    f"rounds_per_task = "
                                                    f"{self.tasks * self.rounds_per_task}")
        if self.buffer_total and self.buffer_total < cfg.clients.num_clients and \
                self.method != "none":
            raise ConfigError("continual.buffer_total", self.buffer_total,
                              f"0 or at least one exemplar per client "
                              f"({cfg.clients.num_clients})")
        if cfg.data.partition != "dirichlet":
            raise ConfigError("data.partition", cfg.data.partition,
                              "dirichlet with a task stream (each task's samples are split by "
                              "Dirichlet(data.alpha), redrawn per task: DROD §3)")
        check_unread(cfg.data, "data",
                     {"feature_skew": "a task stream's inputs are the dataset's",
                      "drift_round": "a task stream drifts by its tasks"}, "a task stream")


registry.register_section("continual", ContinualConfig)
