"""Operations: the embedded Redis, child-process supervision and the ``mtfl`` commands."""
