"""scikit-learn's own estimator checks over both estimators, with no expected failure."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from hmdspt.estimator import BPNNClassifier, BPNNRegressor

# No check is expected to fail. (check_array_api_input is skipped by scikit-learn itself
# unless SCIPY_ARRAY_API=1 is set; it does not apply: the estimators compute in numpy.)
EXPECTED_FAILED: dict = {}


@parametrize_with_checks(
    [BPNNClassifier(random_state=0), BPNNRegressor(random_state=0)],
    expected_failed_checks=lambda est: EXPECTED_FAILED,
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
