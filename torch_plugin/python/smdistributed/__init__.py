"""smdistributed: the open-source smddp re-implementation of SageMaker's distributed libraries."""
